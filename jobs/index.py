"""Entry point for `ray job submit … -- python jobs/index.py --corpus s3://…/export --model …`.

Encodes a corpus (our export, the build's papers table, or a BEIR corpus.jsonl) on the cluster's
encoder actor pools (GPU workers with the cluster profile) into a sharded faiss index on object
storage, with its metadata beside it; into an existing index, only new or changed papers are
encoded. Config as for `cpr index` (profile < `--config` < `CPR_*` variables < `--set` < flags);
on a user error it prints the CLI's one line and exits 2.
"""

from __future__ import annotations

import sys

from cpr_ray.command_line import job_parser, run_job
from cpr_ray.config import load_config
from cpr_ray.search.index import build_index, summary_lines

FLAGS = {"corpus": "search.corpus", "model": "encoder.model", "out": "search.out"}


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__, FLAGS, "search.shard_size=2000000")
    parser.add_argument("--bm25", action="store_true", help="build BM25 beside it (--hybrid)")
    args = parser.parse_args(argv)

    def work() -> list[str]:
        flags = {key: getattr(args, flag) for flag, key in FLAGS.items()}
        if args.bm25:
            flags["search.bm25"] = True
        cfg = load_config(args.profile, args.config, args.overrides, flags=flags)
        return summary_lines(build_index(cfg), str(cfg.search.out))

    return run_job(work)


if __name__ == "__main__":
    sys.exit(main())
