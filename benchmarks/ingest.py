"""Ingest (parse + normalise + link) on a synthetic corpus: the Ray stage vs one DuckDB process.

Baseline: the *same* parsing and linking SQL (`cpr_ray.corpus.records` / `linking`) run by one
DuckDB process over whole tables with all local threads, no buckets, no Ray, writing Parquet.
Candidate: the `ingest` stage on a local Ray (bucketed staging, one task per bucket, Lance output).
Both read the same gzipped shards; `ray.init` is excluded. Prints input lines/s of each and the
ratio. Usage:

    python benchmarks/ingest.py [--papers 1000000] [--citations 5000000] [--buckets 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from cpr_ray.config import load_config
from cpr_ray.corpus import linking, records
from cpr_ray.corpus.ingest import ingest
from cpr_ray.corpus.s2orc import recover_contexts
from cpr_ray.runs.ray_runtime import ensure_ray
from cpr_ray.sample.synthetic import generate
from cpr_ray.storage.store import Storage
from cpr_ray.tables.buckets import BUCKET

S2 = ("papers", "abstracts", "citations", "publication-venues")
OPENALEX = ("works", "sources")


def read_lines(folder: Path) -> pa.Table:
    """All lines of all shards under `folder`, as the `text`/`path` table the parsers take."""
    parts = []
    opts = pacsv.ParseOptions(delimiter="\x01", quote_char=False, escape_char=False)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with pa.input_stream(str(path), compression="gzip") as f:
            t = pacsv.read_csv(
                f,
                read_options=pacsv.ReadOptions(column_names=["text"], block_size=64 << 20),
                parse_options=opts,
                convert_options=pacsv.ConvertOptions(column_types={"text": pa.string()}),
            )
        parts.append(t.append_column("path", pa.array([str(path)] * t.num_rows, pa.string())))
    return pa.concat_tables(parts)


def kept(table: pa.Table) -> pa.Table:
    return table.filter(pc.greater_equal(table[BUCKET], 0))


def duckdb_baseline(raw: Path, out: Path, threads: int) -> tuple[int, float]:
    started = time.perf_counter()
    lines = 0
    parsed = {}
    for name in S2 + OPENALEX:
        folder = raw / ("s2" if name in S2 else "openalex") / name
        table = read_lines(folder)
        lines += table.num_rows
        if name == "works":
            parsed[name] = linking.work_keys(
                records.parse_lines(table, records.SPECS[name], 1, threads=threads), 1, threads
            )
        else:
            parsed[name] = records.parse_lines(table, records.SPECS[name], 1, threads=threads)
    s2k = linking.s2_keys(kept(parsed["papers"]), 1, threads)
    matches = linking.match_keys(s2k, kept(parsed["works"]), 1, threads)
    papers = linking.assemble_papers(
        kept(parsed["papers"]), kept(parsed["abstracts"]), matches, threads
    )
    empty_docs = pa.table(
        {
            c: pa.array([], t)
            for c, t in [
                ("corpus_id", pa.int64()),
                ("text", pa.string()),
                ("bibref", pa.string()),
                ("bibentry", pa.string()),
            ]
        }
    )
    citations = linking.assemble_citations(
        kept(parsed["citations"]), recover_contexts(empty_docs), threads
    )
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(papers, out / "papers.parquet")
    pq.write_table(citations, out / "citations.parquet")
    seconds = time.perf_counter() - started
    print(f"  duckdb: {papers.num_rows:,} papers, {citations.num_rows:,} citations")
    return lines, seconds


def ray_stage(raw: Path, out: Path, buckets: int) -> tuple[dict, float]:
    cfg = load_config(
        "dry-run",
        overrides=[
            f"storage.root={out}",
            f"input.s2={raw / 's2'}",
            f"input.openalex={raw / 'openalex'}",
            f"ingest.num_buckets={buckets}",
            "ingest.batch_size=50000",
            "ingest.parse_buffer_mb=768",  # the cluster profile's
            "ingest.max_reject_rate=0.01",
            "ray.object_store_memory_mb=2048",
        ],
        env={},
    )
    ensure_ray(cfg.ray)
    started = time.perf_counter()
    manifest = ingest(cfg, Storage(cfg.storage), force=True)
    return manifest, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--papers", type=int, default=1_000_000)
    parser.add_argument("--citations", type=int, default=5_000_000)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--work", type=Path, default=Path(".bench/ingest"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    raw = args.work / f"raw-{args.papers}-{args.citations}-{args.seed}"
    if not (raw / "s2").is_dir():
        print(f"generating synthetic corpus: {args.papers:,} papers, {args.citations:,} citations")
        generate(raw, args.papers, args.citations, seed=args.seed)
    threads = os.cpu_count() or 1

    print(f"baseline: DuckDB, one process, {threads} threads")
    shutil.rmtree(args.work / "duckdb-out", ignore_errors=True)
    lines, t_duck = duckdb_baseline(raw, args.work / "duckdb-out", threads)

    print(f"candidate: Ray ingest stage, {args.buckets} buckets")
    shutil.rmtree(args.work / "ray-out", ignore_errors=True)
    manifest, t_ray = ray_stage(raw, args.work / "ray-out", args.buckets)
    s = manifest["stats"]
    print(f"  ray: {s['papers']:,} papers, {s['citations']:,} citations")

    print(f"\ninput lines: {lines:,}")
    print(f"duckdb (single process): {t_duck:8.1f} s  {lines / t_duck:12,.0f} lines/s")
    print(f"ray ingest stage:        {t_ray:8.1f} s  {lines / t_ray:12,.0f} lines/s")
    print(f"ratio ray/duckdb throughput: {t_duck / t_ray:.2f}x")
    print(f"ray ingest phases (s): {s['phase_seconds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
