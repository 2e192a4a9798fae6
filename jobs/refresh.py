"""Entry point for `ray job submit … -- python jobs/refresh.py --config s3://…/refresh.yaml`.

The nightly refresh: applies Semantic Scholar's diffs since the release the corpus holds (API
key in $S2_API_KEY, never logged), then reruns the later build stages, which pay only for new
and changed pairs. Config as for `cpr refresh` (profile < `--config` < `CPR_*` variables <
`--set`); on a user error it prints the same one line as the CLI and exits 2. Submit it with one
`--submission-id` per night: a killed or repeated run picks up where the last one stopped. A
root that a build or another refresh owns is one line, "root owned by HOST since T; retry after
T'", and exit 75, so the scheduler retries or alerts; set `$CPR_JOB_ID` to the same value for
every attempt of one night's job (the RayJob's name) and a retry takes over its killed attempt's
lease at once.
"""

from __future__ import annotations

import sys

from cpr_ray.config import load_config
from cpr_ray.errors import ConfigError
from cpr_ray.pipeline.refresh import refresh, summary_lines
from cpr_ray.runs.command_options import Flag, flag_values, job_parser, run_job

FLAGS = (Flag("refresh.base_release"), Flag("refresh.api_url"))


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__, FLAGS, "refresh.retain_versions_days=14")
    parser.add_argument("--corpus-only", action="store_true", help="rerun no stage")
    args = parser.parse_args(argv)

    def work() -> list[str]:
        if not args.config and not args.profile:
            raise ConfigError("give --config (a path or s3://…) and/or --profile")
        flags = flag_values(FLAGS, vars(args))
        if args.corpus_only:
            flags["refresh.downstream"] = False
        cfg = load_config(args.profile, args.config, args.overrides, flags=flags)
        return summary_lines(refresh(cfg))

    return run_job(work)


if __name__ == "__main__":
    sys.exit(main())
