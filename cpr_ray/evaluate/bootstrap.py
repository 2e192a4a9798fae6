"""Percentile bootstrap confidence intervals over queries, seeded and paired across metrics.

One matrix of resampled query indices is drawn per call and shared by every metric, so the
intervals of different metrics come from the same resamples and a seed reproduces them exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95
_CHUNK = 250  # resamples per block: bounds memory at _CHUNK x n_queries indices


def bootstrap_ci(
    values: Mapping[str, np.ndarray],
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """(low, high) of the mean of each per-query array in `values` (all of one length)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
    lengths = {len(v) for v in arrays.values()}
    if len(lengths) > 1:
        raise ValueError(f"per-query arrays differ in length: {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    if n == 0:
        return {k: (float("nan"), float("nan")) for k in arrays}
    rng = np.random.default_rng(seed)
    means = {k: np.empty(resamples) for k in arrays}
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        idx = rng.integers(0, n, size=(size, n))  # (size, n) resampled query indices
        for k, v in arrays.items():
            means[k][start : start + size] = v[idx].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    return {
        k: (float(np.percentile(m, tail)), float(np.percentile(m, 100 - tail)))
        for k, m in means.items()
    }


def sub_seed(seed: int, label: str) -> int:
    """A stable seed per subgroup (e.g. per domain), independent of the order groups come in."""
    return (seed * 1_000_003 + zlib.crc32(label.encode())) % 2**32
