"""Robustness checks (paper §4): pools without same-topic candidates, and pooler ablations.

- :func:`without_groups`: the same queries and rankings with some candidate groups removed from
  every pool (CPR-eval: the 50 ``shares_query_topic`` candidates, 151 -> 101), so recall can be
  compared with random in each pool (10/151 vs 10/101).
- :func:`order_agreement`: pools rebuilt with one pooling retriever left out are evaluated with
  the same retrievers; the retrievers' order by a metric on the two pools is compared with
  Kendall's tau-b, with the largest change of the metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from cpr_ray.evaluate.benchmark import Benchmark
from cpr_ray.retrieval.base import PAD

SAME_TOPIC = ("shares_query_topic",)


def without_groups(
    bench: Benchmark, ranked: Sequence[np.ndarray], drop: Sequence[str] = SAME_TOPIC
) -> tuple[Benchmark, list[np.ndarray]]:
    """The benchmark with the `drop` groups removed from every pool, and rankings to match."""
    if bench.pools is None or bench.pool_groups is None:
        raise ValueError(f"{bench.name} has no candidate groups to remove")
    removed = np.isin(bench.pool_groups, list(drop)) & (bench.pools != PAD)
    pools = np.where(removed, PAD, bench.pools)
    kept_ranked = []
    for i, r in enumerate(ranked):
        gone = bench.pools[i][removed[i]]
        kept_ranked.append(r[~np.isin(r, gone)])
    return replace(bench, pools=pools, name=f"{bench.name}-without-{'+'.join(drop)}"), kept_ranked


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (ties in either ranking handled); NaN when undefined."""
    a, b = np.asarray(x, float), np.asarray(y, float)
    if len(a) != len(b):
        raise ValueError("x and y differ in length")
    i, j = np.triu_indices(len(a), k=1)
    dx, dy = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    concordant_minus_discordant = float((dx * dy).sum())
    pairs_x, pairs_y = float((dx != 0).sum()), float((dy != 0).sum())
    if pairs_x == 0 or pairs_y == 0:
        return float("nan")
    return concordant_minus_discordant / math.sqrt(pairs_x * pairs_y)


def order_agreement(full: Mapping[str, float], ablated: Mapping[str, float]) -> dict[str, object]:
    """Compare retrievers' scores (name -> metric) on the full and the ablated pools."""
    names = sorted(set(full) & set(ablated))
    if len(names) < 2:
        raise ValueError("need at least two retrievers evaluated on both pools")
    a = [full[n] for n in names]
    b = [ablated[n] for n in names]
    return {
        "retrievers": names,
        "kendall_tau": kendall_tau_b(a, b),
        "max_abs_delta": float(np.max(np.abs(np.subtract(a, b)))),
    }
