"""Entry point for `ray job submit … -- python jobs/evaluate.py --benchmark cpr --data URI …`.

Parses arguments into the same settings as `cpr eval`, runs the evaluation (joining the cluster
through RAY_ADDRESS when large corpora are encoded on actor pools) and prints where the results
file went. `--config FILE` reads the settings from YAML; flags override it; `--set key=value`
sets any other setting (see `cpr_ray/evaluate/settings.py`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from cpr_ray.config import ConfigError
from cpr_ray.evaluate.commands import settings_from
from cpr_ray.evaluate.protocols import LLMLayerMissing
from cpr_ray.evaluate.results import write_results
from cpr_ray.evaluate.runner import run_eval
from cpr_ray.storage import Storage, StorageError

FLAGS = (
    "benchmark",
    "data",
    "retriever",
    "model",
    "subset",
    "rerank",
    "rewrite",
    "out",
    "variant",
    "s3_endpoint",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="YAML file of eval settings")
    for flag in FLAGS:
        parser.add_argument("--" + flag.replace("_", "-"), dest=flag)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other eval setting",
    )
    args = parser.parse_args(argv)
    flags = {f: getattr(args, f) for f in FLAGS}
    try:
        for item in args.overrides:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ConfigError(f"--set {item!r} must look like key=value")
            flags[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        settings = settings_from(args.config, flags)
        if not settings.out:
            raise ConfigError("give --out (a results file or folder)")
        results = run_eval(settings)
        uri = write_results(Storage(settings.storage()), settings.out, results)
    except (ConfigError, StorageError, LLMLayerMissing, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    primary = results["primary_metric"]
    block = results[primary]
    print(
        f"{results['benchmark']} {results.get('subset') or ''} {results['retriever']}: "
        f"{primary} {block['value']:.3f} [{block['ci_low']:.3f}, {block['ci_high']:.3f}] "
        f"(random {block['random']:.3f}), {results['n_queries']} queries → {uri}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
