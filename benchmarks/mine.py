"""Mining (venues → base papers → topic-disjoint pairs + universe): the Ray stages vs DuckDB.

Baseline: `cpr_ray.mining.reference`, the same rules (`cpr_ray.mining.mining_rules`) as one DuckDB
process over the whole ingested tables (read from the same Lance datasets), all local threads.
Candidate: the `venues` + `mine` stages on a local Ray with 1 CPU and with 2 CPUs (each in a
fresh process pinned to that many cores, `ray.init` excluded), timed on the second of two runs:
in a build the workers have already imported what mining needs (ingest ran in them), and the
first run's cold-worker time is printed beside it.
The corpus is generated and ingested once and reused. Prints input rows/s, the ratio to DuckDB,
the 1 → 2 worker speed-up and where the Ray time goes. Usage:

    python benchmarks/mine.py [--papers 1000000] [--citations 10000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import lance

from cpr_ray.config import Config, load_config
from cpr_ray.mining import reference
from cpr_ray.mining.mining_stages import PAPER_COLUMNS
from cpr_ray.storage.store import Storage


def config(work: Path, raw: Path, cpus: int) -> Config:
    return load_config(
        "dry-run",
        overrides=[
            f"storage.root={work / 'build'}",
            f"input.s2={raw / 's2'}",
            f"input.openalex={raw / 'openalex'}",
            f"ray.num_cpus={cpus}",
            "ray.object_store_memory_mb=3072",
            "ingest.num_buckets=8",
            "ingest.batch_size=50000",
            "ingest.max_reject_rate=0.01",
            "ingest.lance_fragment_rows=250000",
            "mining.top_share=0.2",
            "mining.min_venue_papers=20",
            "mining.base_requires_context=true",
            "mining.base_per_field=400",
        ],
        env={},
    )


def prepare(work: Path, raw: Path, papers: int, citations: int) -> None:
    from cpr_ray.corpus.ingest import ingest
    from cpr_ray.runs.ray_runtime import ensure_ray
    from cpr_ray.sample.synthetic import generate

    if not (raw / "s2").is_dir():
        print(f"generating synthetic corpus: {papers:,} papers, {citations:,} citations")
        generate(raw, papers, citations, seed=0)
    cfg = config(work, raw, 2)
    ensure_ray(cfg.ray)
    ingest(cfg, Storage(cfg.storage))  # skipped when already published for this corpus


def run_ray(work: Path, raw: Path, cpus: int) -> dict:
    """Child-process mode: venues + mine with `cpus` CPUs; prints a JSON line of timings."""
    import ray

    from cpr_ray.mining.mining_stages import mine, venues
    from cpr_ray.runs.ray_runtime import ensure_ray

    # N CPUs means N cores: Lance and Arrow inside a task would otherwise decode on every core
    # of the machine, and the 1-CPU run would not be one core's work. Ray's processes inherit it.
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
    cfg = config(work, raw, cpus)
    ensure_ray(cfg.ray)
    storage = Storage(cfg.storage)
    runs = []
    for _ in range(2):  # cold workers, then warm ones as in a build (ingest ran before mine)
        started = time.perf_counter()
        venues(cfg, storage, force=True)
        manifest = mine(cfg, storage, force=True)
        runs.append((time.perf_counter() - started, manifest))
    ray.shutdown()
    (cold, _), (seconds, manifest) = runs
    return {
        "seconds": seconds,
        "cold_seconds": cold,
        "pairs": manifest["stats"]["pairs"],
        "universe": manifest["stats"]["universe"],
        "stage_seconds": manifest["seconds"],
        "phases": manifest["stats"]["phase_seconds"],
    }


def duckdb_baseline(work: Path, raw: Path) -> tuple[int, int, float]:
    cfg = config(work, raw, 2)
    storage = Storage(cfg.storage)
    tables = storage.read_json(f"{storage.root}/ingest/_MANIFEST.json")["tables"]
    started = time.perf_counter()
    mined = reference.mine_whole(
        *reference.load_tables(
            tables["papers"]["uri"],
            tables["citations"]["uri"],
            tables["venues"]["uri"],
            paper_columns=PAPER_COLUMNS,
        ),
        cfg.mining,
        threads=os.cpu_count() or 1,
    )
    return mined.pairs.num_rows, len(mined.universe), time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--papers", type=int, default=1_000_000)
    parser.add_argument("--citations", type=int, default=10_000_000)
    parser.add_argument("--work", type=Path, default=Path(".bench/mine"))
    # child-process modes, so each Ray run starts fresh with its own CPU count
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ray-cpus", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    raw = args.work / f"raw-{args.papers}-{args.citations}"
    if args.prepare:
        prepare(args.work, raw, args.papers, args.citations)
        return 0
    if args.ray_cpus:
        print("RESULT " + json.dumps(run_ray(args.work, raw, args.ray_cpus)))
        return 0

    print("preparing: synthetic corpus + ingest (reused when present)")
    child = [
        sys.executable,
        __file__,
        "--papers",
        str(args.papers),
        "--citations",
        str(args.citations),
        "--work",
        str(args.work),
    ]
    subprocess.run([*child, "--prepare"], check=True, capture_output=True)
    rows = (
        lance.dataset(
            Storage(config(args.work, raw, 2).storage).read_json(
                f"{args.work / 'build'}/ingest/_MANIFEST.json"
            )["tables"]["papers"]["uri"]
        ).count_rows()
        + args.citations
    )

    print("baseline: DuckDB, one process")
    pairs_d, universe_d, t_duck = duckdb_baseline(args.work, raw)
    results = {}
    for cpus in (1, 2):
        print(f"candidate: Ray venues + mine with {cpus} CPU(s)")
        out = subprocess.run([*child, "--ray-cpus", str(cpus)], capture_output=True, text=True)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(out.stdout[-3000:], out.stderr[-3000:])
            return 1
        results[cpus] = json.loads(line[len("RESULT ") :])
        assert results[cpus]["pairs"] == pairs_d, (results[cpus], pairs_d)
        assert results[cpus]["universe"] == universe_d, (results[cpus], universe_d)

    print(
        f"\ninput rows (papers + citations): {rows:,}; pairs {pairs_d:,}; universe {universe_d:,}"
    )
    print(
        f"duckdb, 1 process, {os.cpu_count()} threads: {t_duck:7.1f} s "
        f"{rows / t_duck:12,.0f} rows/s"
    )
    for cpus, r in results.items():
        print(
            f"ray, {cpus} CPU(s):                  {r['seconds']:7.1f} s "
            f"{rows / r['seconds']:12,.0f} rows/s  ratio to duckdb {t_duck / r['seconds']:.2f}x"
            f"  (cold workers: {r['cold_seconds']:.1f} s)"
        )
    for cpus, r in results.items():
        print(f"ray {cpus} CPU(s) phases (s): {r['phases']}")
    print(f"ray 1 → 2 CPUs speed-up: {results[1]['seconds'] / results[2]['seconds']:.2f}x")
    per_core_duck = rows / t_duck / (os.cpu_count() or 1)
    per_core_ray = rows / results[2]["seconds"] / 2
    print(f"per-core throughput ray/duckdb: {per_core_ray / per_core_duck:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
