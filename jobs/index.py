"""Entry point for `ray job submit … -- python jobs/index.py --corpus s3://…/export --model …`.

Encodes a corpus (our export, the build's papers table, or a BEIR corpus.jsonl) on the cluster's
encoder actor pools (with `--profile cluster`, one actor per GPU worker: the profile's `encoder:`
section) into a sharded faiss index on object storage, with its metadata beside it; into an
existing index, only new or changed papers are encoded. The actors write the vectors to storage
themselves: this driver, on the head, holds the documents' table and one chunk of vectors.
Config as for `cpr index` (profile < `--config` < `CPR_*` variables < `--set` < flags); on a
user error it prints the CLI's one line and exits 2.
"""

from __future__ import annotations

import sys

from cpr_ray.runs.command_options import job_given, job_parser, run_job
from cpr_ray.search.search_commands import INDEX_FLAGS
from cpr_ray.search.sharded_index import build_index, summary_lines


def main(argv: list[str] | None = None) -> int:
    args = job_parser(__doc__, INDEX_FLAGS, "search.shard_size=2000000").parse_args(argv)

    def work() -> list[str]:
        given = job_given(args, INDEX_FLAGS)
        cfg = given.load()
        return summary_lines(build_index(cfg), str(cfg.search.out))

    return run_job(work)


if __name__ == "__main__":
    sys.exit(main())
