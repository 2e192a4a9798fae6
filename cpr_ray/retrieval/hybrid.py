"""Hybrid retrieval: a dense retriever and BM25 over the same documents, fused by
:class:`~cpr_ray.retrieval.fusion.Fusion` (the fusion of `cpr search` and `cpr serve`).

Whole-corpus search (``search``) fetches each side's ``Fusion.side_depth`` hits (plus the
query's excluded documents, dropped before the cut as a filter would be) and fuses them: on the
same documents, in the same order, it answers as `cpr search` does on an index of them, BM25's
statistics being those of the same collection. Pooled benchmarks (``score``: CPR-eval,
AnaloBench, BRIGHT's per-query candidates) fuse inside each query's candidates: each side ranks
the pool (ties by the evaluation's seeded random key, as every pooled ranking), the two rankings
are fused, and the scores returned put the pool in the fused order (candidates in neither
side's depth score 0 and are ordered by the evaluation's tie-break).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cpr_ray.retrieval.base import PAD
from cpr_ray.retrieval.bm25 import BM25Retriever
from cpr_ray.retrieval.fusion import Fusion
from cpr_ray.retrieval.neural import DenseRetriever
from cpr_ray.retrieval.ranking import rank_pools


class HybridRetriever:
    name = "hybrid"

    def __init__(
        self, dense: DenseRetriever, bm25: BM25Retriever, fusion: Fusion, seed: int = 0
    ) -> None:
        self.dense, self.bm25, self.fusion, self.seed = dense, bm25, fusion, seed
        self.model = dense.model

    def uses_ray(self, n_docs: int) -> bool:
        return self.dense.uses_ray(n_docs)

    def index(self, texts: Sequence[str]) -> None:
        self.dense.index(texts)
        self.bm25.index(texts)

    def search(
        self, queries: Sequence[str], k: int, excluded: Sequence[np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Positions (n_q, k) and fused scores, best first; PAD past a short fused list.
        `excluded`: per query, positions never returned (dropped from both sides first)."""
        extra = max((len(e) for e in excluded), default=0) if excluded is not None else 0
        fetch = self.fusion.side_depth(k) + extra
        d_idx, d_val = self.dense.search(queries, fetch)
        b_idx, b_val = self.bm25.search(queries, fetch)
        idx = np.full((len(queries), k), PAD, np.int64)
        val = np.full((len(queries), k), -np.inf, np.float32)
        for i in range(len(queries)):
            drop = set() if excluded is None else set(excluded[i].tolist())
            sides = self.fusion.sides(
                d_idx[i].tolist(), d_val[i], b_idx[i].tolist(), b_val[i], k, drop
            )
            fused = self.fusion.fuse(*sides, top_n=k)
            idx[i, : len(fused)] = [f.doc for f in fused]
            val[i, : len(fused)] = [f.score for f in fused]
        return idx, val

    def score(self, queries: Sequence[str], pools: np.ndarray) -> np.ndarray:
        d_scores = self.dense.score(queries, pools)
        b_scores = self.bm25.score(queries, pools)
        d_ranked = rank_pools(d_scores, pools, self.seed)
        b_ranked = rank_pools(b_scores, pools, self.seed)
        out = np.where(pools == PAD, -np.inf, 0.0).astype(np.float32)
        for i, row in enumerate(pools):
            col = {int(p): c for c, p in enumerate(row) if p != PAD}
            by = [
                d_scores[i, [col[p] for p in d_ranked[i]]],
                b_scores[i, [col[p] for p in b_ranked[i]]],
            ]
            sides = self.fusion.sides(d_ranked[i].tolist(), by[0], b_ranked[i].tolist(), by[1], 1)
            fused = self.fusion.fuse(*sides)
            for n, f in enumerate(fused):  # strictly decreasing: the fused order, ties resolved
                out[i, col[f.doc]] = len(fused) - n
        return out
