"""Entry point for `ray job submit … -- python jobs/evaluate.py --benchmark cpr --data URI …`.

Parses arguments into the same config tree as `cpr eval` (profile < `--config FILE` < `CPR_*`
variables < `--set key.path=value` < the flags), runs the evaluation (joining the cluster through
RAY_ADDRESS when large corpora are encoded on actor pools) and publishes the results as `cpr eval`
does (`cpr_ray.evaluate.publish`: the results file, the MTEB files, the model card's row), printing
the same lines. On a user error it prints the same one line as the CLI and exits 2.
"""

from __future__ import annotations

import sys

from cpr_ray.errors import ConfigError
from cpr_ray.evaluate.eval_commands import EVAL_FLAGS
from cpr_ray.evaluate.eval_config_check import check
from cpr_ray.evaluate.eval_run import run_eval
from cpr_ray.evaluate.publish import publish, show
from cpr_ray.runs.command_options import job_given, job_parser, run_job


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__, EVAL_FLAGS, "eval.resamples=500")
    args = parser.parse_args(argv)

    def work() -> list[str]:
        given = job_given(args, EVAL_FLAGS)
        cfg = given.load(check=check)
        if not cfg.eval.out:
            raise ConfigError("give --out (a results file or folder)")
        show(publish(cfg, run_eval(cfg)))
        return []

    return run_job(work)


if __name__ == "__main__":
    sys.exit(main())
