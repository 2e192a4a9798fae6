#!/usr/bin/env bash
# Submits tonight's refresh to the launcher cluster (`ray up cluster.yaml`) and waits for its
# end. Run it from cron or the systemd timer next to it (cpr-refresh.timer, crontab.example).
#
# Idempotent per day: the submission ID is refresh-YYYY-MM-DD (UTC) and Ray refuses a second job
# with the same ID, so a rerun on the same day follows that job instead of submitting one. It
# skips the night when yesterday's refresh is still pending or running, so two refreshes never
# write at once.
#
# Exit status: 0 when the job succeeded (or the night was skipped), 1 when it failed or was
# stopped, after printing the job log's last line (the one-line cause; the traceback is in
# ROOT/_logs/ on the bucket). That is what systemd's OnFailure= (cpr-refresh-alert.service) and
# cron's MAILTO (crontab.example) alert on: a night never fails unseen.
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

cd "$checkout"
if ray job status "$today" >/dev/null 2>&1; then
  echo "$today was already submitted; following it"
elif ray job status "$yesterday" 2>/dev/null | grep -qE 'PENDING|RUNNING'; then
  echo "$yesterday is still running; skipping $today"
  exit 0
else
  commit="$(git rev-parse HEAD)"
  echo "submitting $today at commit $commit"
  ray job submit --submission-id "$today" --no-wait --working-dir . \
    --metadata-json "{\"commit\": \"$commit\"}" \
    -- python jobs/refresh.py --config "$config"
fi

# The driver's output into this log (the unit's journal) until the job ends. The stream may
# also end early (the head restarted, the connection dropped): the job's status then decides,
# polled until it ends; a failure prints Ray's status message and the log's last line (the
# cause), and is this script's exit status 1.
ray job logs --follow "$today" || echo "the log stream of $today ended early"
exec python - "$today" <<'EOF'
import sys
import time

from ray.job_submission import JobStatus, JobSubmissionClient

job, client, pause = sys.argv[1], JobSubmissionClient(), 2
while (info := client.get_job_info(job)).status in (JobStatus.PENDING, JobStatus.RUNNING):
    time.sleep(pause)
    pause = min(pause * 2, 60)
if info.status == JobStatus.SUCCEEDED:
    print(f"{job} succeeded")
    sys.exit(0)
lines = [ln for ln in client.get_job_logs(job).splitlines() if ln.strip()] or ["no log"]
print(f"Ray: {(info.message or '-').splitlines()[0]}", file=sys.stderr)
print(f"{job} {info.status.value}: {lines[-1]}", file=sys.stderr)
sys.exit(1)
EOF
