"""Entry point for `ray job submit … -- python jobs/evaluate.py --benchmark cpr --data URI …`.

Parses arguments into the same config tree as `cpr eval` (profile < `--config FILE` < `CPR_*`
variables < `--set key.path=value` < the flags), runs the evaluation (joining the cluster through
RAY_ADDRESS when large corpora are encoded on actor pools) and prints where the results file
went. On a user error it prints the same one line as the CLI and exits 2.
"""

from __future__ import annotations

import sys

from cpr_ray.command_line import command_config, flag_values, job_parser, run_job
from cpr_ray.errors import ConfigError
from cpr_ray.evaluate.commands import EVAL_FLAGS
from cpr_ray.evaluate.results import write_results
from cpr_ray.evaluate.runner import run_eval
from cpr_ray.evaluate.settings import check
from cpr_ray.storage import Storage
from cpr_ray.train.model_card import record_evaluation


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__, EVAL_FLAGS, "eval.resamples=500")
    args = parser.parse_args(argv)

    def work() -> list[str]:
        flags = flag_values(EVAL_FLAGS, vars(args))
        cfg = command_config(args.profile, args.config, args.overrides, flags, check=check)
        if not cfg.eval.out:
            raise ConfigError("give --out (a results file or folder)")
        results = run_eval(cfg)
        uri = write_results(Storage(cfg.storage), cfg.eval.out, results)
        record_evaluation(Storage(cfg.storage), cfg.encoder.model, results)  # a cpr train card
        primary = results["primary_metric"]
        block = results[primary]
        run = (results["benchmark"], results.get("subset"), results["retriever"])
        return [
            f"{' '.join(part for part in run if part)}: "
            f"{primary} {block['value']:.3f} [{block['ci_low']:.3f}, {block['ci_high']:.3f}] "
            f"(random {block['random']:.3f}), {results['n_queries']} queries → {uri}"
        ]

    return run_job(work)


if __name__ == "__main__":
    sys.exit(main())
