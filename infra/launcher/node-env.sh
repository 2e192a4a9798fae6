# Sourced (not run) by cluster.yaml's `ray start` commands, with the node's role:
#   source /home/ray/cpr-ray/infra/launcher/node-env.sh head && ray start --head ...
#   source /home/ray/cpr-ray/infra/launcher/node-env.sh worker && ray start ...
# and with `client` by a shell on a node that only talks to Ray (`... client && ray status`).
# Exports into the shell that starts Ray the secrets that node's processes use, so the raylet
# and every worker and job driver it spawns inherit them, and nothing more:
#
#   parameter (under $CPR_SSM_PREFIX)  head     worker   client   used by
#   RAY_AUTH_TOKEN                     needed   needed   needed   Ray itself: every node, the
#                                                                 dashboard and the job API
#                                                                 (with RAY_AUTH_MODE=token)
#   OPENAI_API_KEY                     needed   needed   -        LLM calls: drivers on the head,
#                                                                 LLM actors on any worker
#   S2_API_KEY                         needed   -        -        the refresh's driver (head)
#   CPR_SEARCH_API_KEY                 if set   -        -        the search service's ingress
#                                                                 (head, infra/serve/search.yaml)
#
# A parameter the node needs but SSM lacks ends the script with one `error:` line naming it (so
# `&& ray start` never runs); one it may go without is skipped with a `note:` line. The values
# are SecureString parameters read with the node's instance profile
# (infra/launcher/iam-policy-secrets-*.json); they are never written to disk. Needs boto3 (in
# the image) and AWS_DEFAULT_REGION (cluster.yaml's docker run_options).

CPR_SSM_PREFIX="${CPR_SSM_PREFIX:-/cpr-ray}"

case "${1:-}" in
  head) _cpr_params="RAY_AUTH_TOKEN OPENAI_API_KEY S2_API_KEY CPR_SEARCH_API_KEY?" ;;
  worker) _cpr_params="RAY_AUTH_TOKEN OPENAI_API_KEY" ;;
  client) _cpr_params="RAY_AUTH_TOKEN" ;;
  *)
    echo "error: node-env.sh needs the node's role: source node-env.sh head|worker|client" >&2
    return 1
    ;;
esac

# one SSM call for all of them; prints `export NAME=VALUE` lines for the shell to evaluate
# shellcheck disable=SC2086  # the names are words
_cpr_exports="$(python - "$CPR_SSM_PREFIX" $_cpr_params <<'PY'
import shlex
import sys

import boto3
import botocore.exceptions

prefix, wanted = sys.argv[1].rstrip("/"), sys.argv[2:]
names = {f"{prefix}/{w.rstrip('?')}": w for w in wanted}
try:
    reply = boto3.client("ssm").get_parameters(Names=list(names), WithDecryption=True)
except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
    sys.exit(f"error: cannot read the SSM parameters {', '.join(names)}: {exc}")
found = {p["Name"]: p["Value"] for p in reply["Parameters"]}
missing = [n for n, w in names.items() if n not in found and not w.endswith("?")]
if missing:
    sys.exit(f"error: SSM parameter {' and '.join(missing)} not set; this node needs it "
             "(infra/README.md, the SSM parameters step)")
for name, want in names.items():
    var = want.rstrip("?")
    if name in found:
        print(f"export {var}={shlex.quote(found[name])}")
    else:
        print(f"note: SSM parameter {name} is not set; {var} stays unset", file=sys.stderr)
PY
)" || { unset _cpr_params _cpr_exports; return 1; }
eval "$_cpr_exports"
# every node and every client of the dashboard and job API authenticate with RAY_AUTH_TOKEN
export RAY_AUTH_MODE=token
unset _cpr_params _cpr_exports
