"""Scores -> rankings, with ties broken by a seeded random key.

Ties must not be broken by pool order: in CPR-eval the positive comes first in its pool, so a
retriever that scores everything 0 (BM25 with no shared term) would look perfect. A seeded random
key per (query, candidate) breaks ties instead: deterministic, and fair on average.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cpr_ray.retrieval.base import PAD


def rank_pools(scores: np.ndarray, pools: np.ndarray, seed: int = 0) -> list[np.ndarray]:
    """Per query, its pool's doc positions best first. `scores` aligns with `pools` (n_q, m)."""
    if scores.shape != pools.shape:
        raise ValueError(f"scores {scores.shape} do not align with pools {pools.shape}")
    pad = pools == PAD
    key = np.where(pad, -np.inf, np.nan_to_num(scores.astype(np.float64), nan=-np.inf))
    tie = np.random.default_rng(seed).random(pools.shape)  # (n_q, m)
    tie[pad] = np.inf
    order = np.lexsort((tie, -key), axis=-1)  # primary: score desc; then random key
    ranked = np.take_along_axis(pools, order, axis=1)
    sizes = (~pad).sum(axis=1)
    return [ranked[i, : sizes[i]] for i in range(len(pools))]


def drop_excluded(
    ranked: Sequence[np.ndarray], excluded: Sequence[np.ndarray] | None, k: int
) -> list[np.ndarray]:
    """Remove each query's excluded documents from its ranking and cut it to k."""
    if excluded is None:
        return [r[:k] for r in ranked]
    return [r[~np.isin(r, e)][:k] for r, e in zip(ranked, excluded)]
