"""Writing the corpus: shards of gzipped JSON lines with malformed lines mixed in, `generate`,
and the command line."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl

from cpr_ray.sample.synthetic.citations import _citations
from cpr_ray.sample.synthetic.column_helpers import _json_lines
from cpr_ray.sample.synthetic.design import (
    _ABSTRACTS,
    _CITATIONS,
    _MIN_VENUES,
    _PAPERS,
    _PAPERS_PER_VENUE,
    _SOURCES,
    _TABLES,
    _VENUES,
    _WORKS,
    S2_ONLY,
    SNAPSHOT_DATE,
    SyntheticStats,
    _Table,
)
from cpr_ray.sample.synthetic.papers import _entities
from cpr_ray.sample.synthetic.table_rows import (
    _abstract_records,
    _citation_records,
    _paper_records,
    _source_records,
    _work_lines,
    _World,
)
from cpr_ray.sample.synthetic.topics_and_text import _taxonomy, _timestamps
from cpr_ray.sample.synthetic.venues import _venues


def _corrupt(line: str, kind: int, table: _Table, rng: np.random.Generator) -> str:
    """A malformed line made from a valid one: truncated, garbage, without its id, with a bad id."""
    if kind == 0:
        return line[: int(rng.integers(1, len(line) - 1))]
    if kind == 1:
        return f"<html><body>502 Bad Gateway {int(rng.integers(1 << 40)):x}</body></html>"
    record = json.loads(line)
    if kind == 2:
        del record[table.id_key]
    else:
        record[table.id_key] = table.bad_id
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _with_malformed(
    lines: pl.Series, rate: float, table: _Table, rng: np.random.Generator
) -> tuple[pl.Series, int]:
    """`lines` with Binomial(len, rate) malformed lines inserted at random positions."""
    n = len(lines)
    k = int(rng.binomial(n, rate)) if n else 0
    if k == 0:
        return lines, 0
    bad = [
        _corrupt(lines[int(i)], int(kind), table, rng)
        for i, kind in zip(rng.integers(0, n, k), rng.integers(0, 4, k))
    ]
    order = np.insert(np.arange(n), np.sort(rng.integers(0, n + 1, k)), n + np.arange(k))
    return pl.concat([lines, pl.Series(bad)]).gather(order), k


def _write_lines(path: Path, lines: pl.Series) -> None:
    """Gzipped lines, published by rename so a partial file never has the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    pl.DataFrame({"line": lines}).write_csv(
        partial,
        include_header=False,
        quote_style="never",
        compression="gzip",
        compression_level=1,
        check_extension=False,
    )
    partial.replace(path)


def _write_table(
    out: Path,
    table: _Table,
    rows: np.ndarray,
    n_shards: int,
    lines_of: Callable[[np.ndarray, np.random.Generator, int], pl.Series],
    seed: int,
    malformed_rate: float,
) -> int:
    """Writes `rows` in `n_shards` shards, each with its own random stream; returns the number of
    malformed lines."""
    malformed = 0
    for shard, shard_rows in enumerate(np.array_split(rows, n_shards)):
        rng = np.random.default_rng([seed, _TABLES.index(table), shard])
        lines, bad = _with_malformed(lines_of(shard_rows, rng, shard), malformed_rate, table, rng)
        _write_lines(out / table.pattern.format(shard=shard), lines)
        malformed += bad
    return malformed


def _world(seed: int, n_papers: int, n_citations: int, overlap: float) -> _World:
    rng = np.random.default_rng(seed)
    tax = _taxonomy()
    venues = _venues(rng, tax, max(_MIN_VENUES, n_papers // _PAPERS_PER_VENUE))
    ent = _entities(rng, tax, venues, n_papers, overlap)
    cit = _citations(rng, ent, n_citations)
    resolved = cit.cited >= 0
    return _World(
        tax=tax,
        venues=venues,
        ent=ent,
        cit=cit,
        citation_count=np.bincount(cit.cited[resolved], minlength=n_papers),
        reference_count=np.bincount(cit.citing, minlength=n_papers),
        influential_count=np.bincount(cit.cited[resolved & cit.influential], minlength=n_papers),
        work_rows=rng.permutation(np.flatnonzero(ent.join != S2_ONLY)),
        s2_updated=_timestamps(rng, "2022-01-20", 10, "ms", "Z"),
        citation_updated=_timestamps(rng, "2020-03-01", 300, "ms", "Z"),
        oa_updated=_timestamps(rng, SNAPSHOT_DATE, 1, "us", ""),
    )


def generate(
    out_dir: str | os.PathLike,
    n_papers: int,
    n_citations: int,
    *,
    seed: int = 0,
    n_shards: int = 4,
    malformed_rate: float = 0.001,
    overlap: float = 0.9,
) -> SyntheticStats:
    """Writes the synthetic S2 and OpenAlex dumps under `out_dir` (layout and ground truth in the
    module docstring); the same arguments always give the same bytes."""
    if n_papers < 1:
        raise ValueError(f"n_papers must be at least 1, got {n_papers}")
    if n_citations < 0:
        raise ValueError(f"n_citations must be at least 0, got {n_citations}")
    if n_shards < 1:
        raise ValueError(f"n_shards must be at least 1, got {n_shards}")
    if not 0 <= malformed_rate < 1:
        raise ValueError(f"malformed_rate must be in [0, 1), got {malformed_rate}")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    out = Path(out_dir)
    w = _world(seed, n_papers, n_citations, overlap)
    ent = w.ent
    papers = np.arange(n_papers)
    abstracts = np.flatnonzero(ent.has_abstract)
    works = w.work_rows
    citations = np.arange(len(w.cit.citing))

    def write(
        table: _Table,
        rows: np.ndarray,
        shards: int,
        rate: float,
        lines_of: Callable[[np.ndarray, np.random.Generator, int], pl.Series],
    ) -> int:
        return _write_table(out, table, rows, shards, lines_of, seed, rate)

    malformed = {
        _PAPERS.name: write(
            _PAPERS,
            papers,
            n_shards,
            malformed_rate,
            lambda r, g, _: _json_lines(_paper_records(w, r, g)),
        ),
        _ABSTRACTS.name: write(
            _ABSTRACTS,
            abstracts,
            n_shards,
            malformed_rate,
            lambda r, g, _: _json_lines(_abstract_records(w, r, g)),
        ),
        _CITATIONS.name: write(
            _CITATIONS,
            citations,
            n_shards,
            malformed_rate,
            lambda r, g, s: _json_lines(_citation_records(w, r, g, s)),
        ),
        _VENUES.name: write(
            _VENUES,
            np.arange(len(w.venues.s2)),
            1,
            malformed_rate,
            lambda r, g, _: _json_lines(w.venues.s2[r]),
        ),
        _WORKS.name: write(
            _WORKS, works, n_shards, malformed_rate, lambda r, g, _: _work_lines(w, r, g)
        ),
    }
    write(
        _SOURCES,
        np.arange(len(w.venues.sources)),
        1,
        0.0,
        lambda r, g, _: _json_lines(_source_records(w)),
    )
    return SyntheticStats(
        papers=n_papers,
        abstracts=len(abstracts),
        citations=len(citations),
        venues=len(w.venues.s2),
        works=len(works),
        sources=len(w.venues.sources),
        malformed=malformed,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cpr_ray.sample.synthetic",
        description="Write a synthetic S2 + OpenAlex raw corpus.",
    )
    parser.add_argument("out", help="output directory")
    parser.add_argument("--papers", type=int, required=True, help="number of S2 papers")
    parser.add_argument("--citations", type=int, required=True, help="number of S2 citation rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, default=4, help="shards per big table")
    parser.add_argument("--malformed-rate", type=float, default=0.001)
    parser.add_argument(
        "--overlap", type=float, default=0.9, help="share of S2 papers with an OpenAlex work"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    stats = generate(
        args.out,
        args.papers,
        args.citations,
        seed=args.seed,
        n_shards=args.shards,
        malformed_rate=args.malformed_rate,
        overlap=args.overlap,
    )
    print(json.dumps({**asdict(stats), "seconds": round(time.perf_counter() - started, 1)}))
