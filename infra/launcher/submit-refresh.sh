#!/usr/bin/env bash
# Submits tonight's refresh to the launcher cluster (`ray up cluster.yaml`). Run it from cron or
# the systemd timer next to it (cpr-refresh.timer, crontab.example).
#
# Idempotent per day: the submission ID is refresh-YYYY-MM-DD (UTC) and Ray refuses a second job
# with the same ID, so a rerun on the same day does nothing. It also skips the night when
# yesterday's refresh is still pending or running, so two refreshes never write at once.
#
# The job runs the code of the checkout in CPR_RAY_CHECKOUT: `--working-dir .` uploads it, and it
# comes first on sys.path of the driver and every worker. The cluster's nodes hold the
# dependencies (its images); after dependency changes, build new images and rerun `ray up`.
#
# Environment (e.g. /etc/cpr-ray/refresh.env for systemd): RAY_ADDRESS (required, the head's
# dashboard, http://HEAD_PRIVATE_IP:8265), RAY_AUTH_TOKEN_PATH (required: a file, readable only
# by the user running this, holding the cluster's Ray token, SSM /cpr-ray/RAY_AUTH_TOKEN; or the
# token itself in RAY_AUTH_TOKEN), CPR_RAY_CHECKOUT, CPR_REFRESH_CONFIG.
# No API keys here: the cluster's nodes fetch them (infra/launcher/node-env.sh).
set -euo pipefail

: "${RAY_ADDRESS:?set RAY_ADDRESS to the dashboard of the head, e.g. http://10.0.1.23:8265}"
export RAY_ADDRESS
# the cluster's dashboard and job API take requests only with its token (RAY_AUTH_MODE=token)
if [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
  echo "error: no Ray token: set RAY_AUTH_TOKEN_PATH to the file holding the cluster's" \
    "(SSM /cpr-ray/RAY_AUTH_TOKEN; infra/README.md)" >&2
  exit 2
fi
export RAY_AUTH_MODE=token
checkout="${CPR_RAY_CHECKOUT:-/srv/cpr-ray}"
config="${CPR_REFRESH_CONFIG:-s3://my-cpr-bucket/configs/refresh.yaml}"
today="refresh-$(date -u +%F)"
yesterday="refresh-$(date -u -d yesterday +%F)"

if ray job status "$today" >/dev/null 2>&1; then
  echo "$today was already submitted; nothing to do"
  exit 0
fi
if ray job status "$yesterday" 2>/dev/null | grep -qE 'PENDING|RUNNING'; then
  echo "$yesterday is still running; skipping $today"
  exit 0
fi

cd "$checkout"
commit="$(git rev-parse HEAD)"
echo "submitting $today at commit $commit"
exec ray job submit --submission-id "$today" --no-wait --working-dir . \
  --metadata-json "{\"commit\": \"$commit\"}" \
  -- python jobs/refresh.py --config "$config"
