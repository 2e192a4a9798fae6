"""Fusing rankings of one query into one: reciprocal rank fusion, and hybrid retrieval's fusion.

Reciprocal rank fusion (Cormack et al., 2009): score(d) = sum over rankings i containing d of
w_i / (k + rank_i(d)), with 1-based ranks. RAG-Fusion fuses the rankings of several generated
queries this way.

Hybrid retrieval (:class:`Fusion`) fuses a dense and a BM25 ranking of the same query, each cut
to ``depth`` hits, by RRF or by a convex sum of their min-max normalised scores. It is the one
fusion of `cpr search`, `cpr serve` and `cpr eval --retriever hybrid` (:func:`Fusion.fuse`), so
what the evaluation measures is what a researcher searches with. Both sides reach it in the
same form (:func:`Fusion.sides`): the query's excluded documents dropped from each side before
its cut (as a filter would), and BM25's documents that share no term with the query (score 0)
left out of its ranking: they are not matches, and their order among themselves is arbitrary.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from cpr_ray.config.search import FusionConfig
from cpr_ray.sections import derive

Id = TypeVar("Id", bound=Hashable)

RRF_K = 60


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Id]],
    *,
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
    top_n: int | None = None,
) -> list[Id]:
    """Fuse best-first rankings (`fused_scores`' order, without the scores)."""
    return [doc for doc, _ in fused_scores(rankings, k=k, weights=weights, top_n=top_n)]


def fused_scores(
    rankings: Sequence[Sequence[Id]],
    *,
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
    top_n: int | None = None,
) -> list[tuple[Id, float]]:
    """(document, fused score) pairs of best-first rankings, best first; ties go to the better
    best rank, then to first appearance. A document repeated inside one ranking counts at its
    first (best) rank only."""
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
    return [(d, score[d]) for d in (fused if top_n is None else fused[:top_n])]


@dataclass(frozen=True)
class Fused:
    """One fused hit: its document, fused score and 1-based rank on each side (None: not in
    that side's fused depth)."""

    doc: Any
    score: float
    dense_rank: int | None
    bm25_rank: int | None


class Fusion(FusionConfig):
    """The `fusion:` section (its settings declared and checked there) with what it does, as
    the retrievers use it (plain values: it travels to Ray actors).

    ``rrf``: reciprocal rank fusion with constant ``k``. ``convex``: ``weight`` x dense +
    (1 - ``weight``) x BM25, each side's scores min-max normalised over its own ``depth`` hits
    (a document absent from a side gets 0 there). Ties, in both: the better best rank, then
    the dense side's order, then BM25's, so a fused ranking is a function of the two rankings.
    """

    @classmethod
    def from_config(cls, section: FusionConfig) -> Fusion:
        return derive(cls, section)

    def describe(self) -> dict[str, Any]:
        """The settings that decide a fused ranking, as results and reports name them."""
        d = self.model_dump()
        d.pop("weight" if self.method == "rrf" else "k")
        return d

    @property
    def label(self) -> str:
        """Short name: ``rrf(k=60,depth=100)`` or ``convex(w=0.5,depth=100)``."""
        if self.method == "rrf":
            return f"rrf(k={self.k},depth={self.depth})"
        return f"convex(w={self.weight:g},depth={self.depth})"

    def side_depth(self, top_n: int) -> int:
        """Hits each side contributes: ``depth``, or more when more hits are asked for."""
        return max(self.depth, top_n)

    def sides(
        self,
        dense_docs: Sequence[Any],
        dense_scores: Sequence[float] | np.ndarray,
        bm25_docs: Sequence[Any],
        bm25_scores: Sequence[float] | np.ndarray,
        top_n: int,
        excluded: Collection[Any] = (),
    ) -> tuple[list[tuple[Any, float]], list[tuple[Any, float]]]:
        """Each side's (doc, score) best first, as :meth:`fuse` takes them: `excluded` dropped,
        no-result cells (doc -1, score -inf) and BM25's non-matches (score <= 0) left out, then
        cut to the side depth. A caller fetches ``side_depth(top_n) + len(excluded)`` per side."""
        depth = self.side_depth(top_n)

        def keep(
            docs: Sequence[Any], scores: Sequence[float] | np.ndarray, floor: float
        ) -> list[tuple[Any, float]]:
            out: list[tuple[Any, float]] = []
            for d, s in zip(docs, scores):
                if len(out) == depth:
                    break
                if d != -1 and s > floor and d not in excluded:
                    out.append((d, float(s)))
            return out

        return keep(dense_docs, dense_scores, -np.inf), keep(bm25_docs, bm25_scores, 0.0)

    def fuse(
        self,
        dense: Sequence[tuple[Any, float]],
        bm25: Sequence[tuple[Any, float]],
        top_n: int | None = None,
    ) -> list[Fused]:
        """The fused ranking of two sides given best first as (doc, score) (:meth:`sides`)."""
        d_rank = {d: r for r, (d, _) in enumerate(dense, start=1)}
        b_rank = {d: r for r, (d, _) in enumerate(bm25, start=1)}
        if self.method == "rrf":
            fused = fused_scores([[d for d, _ in dense], [d for d, _ in bm25]], k=self.k)
        else:
            score: dict[Any, float] = {}
            for side, w in ((dense, self.weight), (bm25, 1.0 - self.weight)):
                for d, s in zip((d for d, _ in side), _min_max([s for _, s in side])):
                    score[d] = score.get(d, 0.0) + w * s
            order = {d: n for n, d in enumerate([*d_rank, *b_rank])}  # dense's order first
            big = len(dense) + len(bm25) + 1
            best = {d: min(d_rank.get(d, big), b_rank.get(d, big)) for d in score}
            fused = [
                (d, score[d]) for d in sorted(score, key=lambda d: (-score[d], best[d], order[d]))
            ]
        fused = fused if top_n is None else fused[:top_n]
        return [Fused(d, s, d_rank.get(d), b_rank.get(d)) for d, s in fused]


def _min_max(scores: Sequence[float]) -> list[float]:
    """Scores mapped onto [0, 1] by their own minimum and maximum (all equal: all 1)."""
    if not scores:
        return []
    lo, hi = min(scores), max(scores)
    return [1.0 if hi == lo else (s - lo) / (hi - lo) for s in scores]
