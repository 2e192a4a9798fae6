"""Entry point for `ray job submit … -- python jobs/train.py --data URI --model M --out URI …`.

Parses arguments into the same config tree as `cpr train` (profile < `--config FILE` < `CPR_*`
variables < `--set key.path=value` < the flags), runs the training on the cluster it joins
through RAY_ADDRESS and prints where the model and metrics went. On a user error it prints the
same one line as the CLI and exits 2. Rerunning with the same --out resumes the run.
"""

from __future__ import annotations

import sys

from cpr_ray.runs.command_options import job_given, job_parser, run_job
from cpr_ray.train.train_command import REQUIRED, TRAIN_FLAGS, summary_lines
from cpr_ray.train.trainer import run_train


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__, TRAIN_FLAGS, "train.workers=8")
    args = parser.parse_args(argv)

    def work() -> list[str]:
        given = job_given(args, TRAIN_FLAGS)
        return summary_lines(run_train(given.load(required=REQUIRED)))

    return run_job(work)


if __name__ == "__main__":
    sys.exit(main())
