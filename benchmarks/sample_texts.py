"""Real texts for the benchmarks: the bundled sample's abstracts."""

from __future__ import annotations

import duckdb

from cpr_ray.config import sample_dir


def abstracts(n: int) -> list[str]:
    """The first `n` non-empty abstracts of the bundled sample, repeated if it holds fewer."""
    path = sample_dir() / "s2" / "abstracts" / "*.gz"
    rows = duckdb.sql(
        f"SELECT abstract FROM read_json_auto('{path}') "
        "WHERE length(trim(coalesce(abstract, ''))) > 0 ORDER BY corpusid"
    ).fetchall()
    texts = [r[0] for r in rows]
    return (texts * (n // len(texts) + 1))[:n]
