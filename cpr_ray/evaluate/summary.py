"""Rankings of one benchmark -> the metric blocks of a results file (pure, no I/O).

Each metric becomes ``{"value", "ci_low", "ci_high", "random", "vs_random"}``: the mean over
queries, its bootstrap interval, the mean expectation under random ranking of each query's pool,
and value / random. Queries without any relevant document are left out and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cpr_ray.evaluate.benchmark import Benchmark
from cpr_ray.evaluate.bootstrap import CONFIDENCE, RESAMPLES, bootstrap_ci, sub_seed
from cpr_ray.evaluate.ir_metrics import METRICS, Gain, Judged, judge, per_query, random_expectation
from cpr_ray.retrieval.base import PAD


@dataclass(frozen=True)
class SummaryOptions:
    seed: int = 0
    resamples: int = RESAMPLES
    confidence: float = CONFIDENCE
    gain: Gain = "exponential"


@dataclass(frozen=True)
class QueryScores:
    """Per-query metric values and random expectations of the evaluable queries."""

    keep: np.ndarray  # (n_queries,) bool: has a relevant document
    values: dict[str, np.ndarray]  # metric -> (n_kept,)
    random: dict[str, np.ndarray]  # metric -> (n_kept,)
    pool_sizes: np.ndarray  # (n_kept,)


def _pool_grades(bench: Benchmark, keep: np.ndarray) -> list[np.ndarray]:
    out = []
    for i in np.flatnonzero(keep):
        rel = bench.qrels[i]
        if bench.pools is not None:
            pool = bench.pools[i][bench.pools[i] != PAD]
            grades = [rel[int(d)] for d in pool if rel.get(int(d), 0) >= 1]
        else:
            skip = set() if bench.excluded is None else set(bench.excluded[i].tolist())
            grades = [g for d, g in rel.items() if g >= 1 and d not in skip]
        out.append(np.asarray(grades, dtype=np.float64))
    return out


def query_scores(
    bench: Benchmark,
    ranked: Sequence[np.ndarray],
    gain: Gain = "exponential",
) -> QueryScores:
    keep = np.array([any(g >= 1 for g in rel.values()) for rel in bench.qrels], dtype=bool)
    idx = np.flatnonzero(keep).tolist()
    j: Judged = judge([ranked[i] for i in idx], [bench.qrels[i] for i in idx])
    sizes = bench.pool_sizes()[idx]
    rnd = random_expectation(sizes, _pool_grades(bench, keep), j.n_relevant, j.ideal_grades, gain)
    return QueryScores(keep, per_query(j, gain), rnd, sizes)


def metric_blocks(
    values: dict[str, np.ndarray], random: dict[str, np.ndarray], opts: SummaryOptions, seed: int
) -> dict[str, Any]:
    ci = bootstrap_ci(values, resamples=opts.resamples, confidence=opts.confidence, seed=seed)
    out: dict[str, Any] = {}
    for m in METRICS:
        value = float(values[m].mean()) if len(values[m]) else float("nan")
        rnd = float(random[m].mean()) if len(random[m]) else float("nan")
        out[m] = {
            "value": value,
            "ci_low": ci[m][0],
            "ci_high": ci[m][1],
            "random": rnd,
            "vs_random": value / rnd if rnd > 0 else None,
        }
    return out


def summarize(bench: Benchmark, ranked: Sequence[np.ndarray], opts: SummaryOptions) -> dict:
    """Overall and per-domain metric blocks of one benchmark's rankings."""
    qs = query_scores(bench, ranked, opts.gain)
    out: dict[str, Any] = {
        "n_queries": int(qs.keep.sum()),
        "n_queries_without_relevant": int((~qs.keep).sum()),
        "n_candidates_mean": float(qs.pool_sizes.mean()) if len(qs.pool_sizes) else 0.0,
        "n_documents": len(bench.doc_ids),
        **metric_blocks(qs.values, qs.random, opts, opts.seed),
    }
    if bench.primary_metric == "accuracy":
        out["accuracy"] = out["recall_at_1"]
    out["per_domain"] = {}
    if bench.domains is not None:
        domains = np.array([bench.domains[i] or "unknown" for i in np.flatnonzero(qs.keep)])
        for d in sorted(set(domains.tolist())):
            sel = domains == d
            block = metric_blocks(
                {m: v[sel] for m, v in qs.values.items()},
                {m: v[sel] for m, v in qs.random.items()},
                opts,
                sub_seed(opts.seed, d),
            )
            out["per_domain"][d] = {"n_queries": int(sel.sum()), **block}
    return out
