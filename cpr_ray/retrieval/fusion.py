"""Reciprocal rank fusion (Cormack et al., 2009): several rankings of one query -> one ranking.

score(d) = sum over rankings i containing d of w_i / (k + rank_i(d)), with 1-based ranks. RAG-Fusion
fuses the rankings of several generated queries this way.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal, TypeVar, overload

Id = TypeVar("Id", bound=Hashable)

RRF_K = 60


@overload
def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Id]],
    *,
    k: int = ...,
    weights: Sequence[float] | None = ...,
    top_n: int | None = ...,
    with_scores: Literal[False] = ...,
) -> list[Id]: ...


@overload
def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Id]],
    *,
    k: int = ...,
    weights: Sequence[float] | None = ...,
    top_n: int | None = ...,
    with_scores: Literal[True],
) -> list[tuple[Id, float]]: ...


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Id]],
    *,
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
    top_n: int | None = None,
    with_scores: bool = False,
) -> list[Id] | list[tuple[Id, float]]:
    """Fuse best-first rankings; ties go to the better best rank, then to first appearance.

    A document repeated inside one ranking counts at its first (best) rank only. With
    `with_scores`, (document, fused score) pairs.
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
    fused = fused if top_n is None else fused[:top_n]
    return [(d, score[d]) for d in fused] if with_scores else fused
