"""Reciprocal rank fusion (Cormack et al., 2009): several rankings of one query -> one ranking.

score(d) = sum over rankings i containing d of w_i / (k + rank_i(d)), with 1-based ranks. RAG-Fusion
fuses the rankings of several generated queries this way.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

Id = TypeVar("Id", bound=Hashable)

RRF_K = 60


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Id]],
    *,
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
    top_n: int | None = None,
) -> list[Id]:
    """Fuse best-first rankings; ties go to the better best rank, then to first appearance.

    A document repeated inside one ranking counts at its first (best) rank only.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if weights is not None and len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    score: dict[Id, float] = {}
    best: dict[Id, int] = {}
    seen: dict[Id, int] = {}
    for i, ranking in enumerate(rankings):
        w = 1.0 if weights is None else float(weights[i])
        done: set[Id] = set()
        for rank, doc in enumerate(ranking, start=1):
            if doc in done:
                continue
            done.add(doc)
            score[doc] = score.get(doc, 0.0) + w / (k + rank)
            best[doc] = min(best.get(doc, rank), rank)
            seen.setdefault(doc, len(seen))
    fused = sorted(score, key=lambda d: (-score[d], best[d], seen[d]))
    return fused if top_n is None else fused[:top_n]
