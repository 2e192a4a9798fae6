# Sourced (not run) by cluster.yaml's `ray start` commands on every launcher node:
#   source /home/ray/cpr-ray/infra/launcher/node-env.sh && ray start ...
# Exports the jobs' API keys into the shell that starts Ray, so the raylet and every worker and
# job driver it spawns inherit them. The values are SecureString parameters in SSM Parameter
# Store, read with the node's instance profile (infra/launcher/iam-policy-secrets.json); they are
# never written to disk or into a config file. Needs boto3 (a dependency of this package,
# installed by the setup commands) and AWS_DEFAULT_REGION (cluster.yaml's docker run_options).

CPR_SSM_PREFIX="${CPR_SSM_PREFIX:-/cpr-ray}"

_cpr_ssm_value() {
  python -c '
import sys

import boto3

reply = boto3.client("ssm").get_parameter(Name=sys.argv[1], WithDecryption=True)
print(reply["Parameter"]["Value"])
' "$1"
}

S2_API_KEY="$(_cpr_ssm_value "$CPR_SSM_PREFIX/S2_API_KEY")" || return 1
OPENAI_API_KEY="$(_cpr_ssm_value "$CPR_SSM_PREFIX/OPENAI_API_KEY")" || return 1
export S2_API_KEY OPENAI_API_KEY
# the search service's client key (infra/serve/search.yaml: search.serve.api_key_env)
CPR_SEARCH_API_KEY="$(_cpr_ssm_value "$CPR_SSM_PREFIX/CPR_SEARCH_API_KEY")" || return 1
export CPR_SEARCH_API_KEY
unset -f _cpr_ssm_value
