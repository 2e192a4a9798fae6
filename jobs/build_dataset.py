"""Entry point for `ray job submit … -- python jobs/build_dataset.py --config FILE`.

Parses arguments, runs the build stages through the same code as `cpr build`, and prints where
each stage published its manifest. On a cluster, RAY_ADDRESS (set by `ray job submit`) makes the
job join the cluster instead of starting a local Ray.
"""

from __future__ import annotations

import sys

from cpr_ray.config import load_config
from cpr_ray.pipeline.build import run_build
from cpr_ray.runs.command_options import job_parser, run_job
from cpr_ray.runs.stage_runner import manifest_uri
from cpr_ray.stages import STAGES
from cpr_ray.storage.store import Storage


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__, (), "ingest.num_buckets=64")
    parser.add_argument("--stages", help=f"comma-separated subset of: {', '.join(STAGES)}")
    parser.add_argument("--force", action="store_true", help="rerun published stages")
    args = parser.parse_args(argv)
    if not args.config and not args.profile:
        parser.error("give --config and/or --profile")

    def work() -> list[str]:
        cfg = load_config(args.profile, args.config, args.overrides)
        stages = [s.strip() for s in args.stages.split(",")] if args.stages else None
        manifests = run_build(cfg, stages, force=args.force)
        storage = Storage(cfg.storage)
        return [
            f"{name}: run {manifest['run_id']} → {manifest_uri(storage, name)}"
            for name, manifest in manifests.items()
        ]

    return run_job(work)


if __name__ == "__main__":
    sys.exit(main())
