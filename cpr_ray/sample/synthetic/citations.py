"""Citations: mostly within the citing field, to earlier papers, half to recent ones and half by
a heavy-tailed fitness; unique pairs, some unresolved."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cpr_ray.sample.synthetic.design import (
    _CITATION_ROUNDS,
    _CROSS_FIELD_CITATION,
    _INTENT_SETS,
    _UNRESOLVED_CITATION,
    FIELD_IDS,
)
from cpr_ray.sample.synthetic.papers import _Entities


@dataclass(frozen=True)
class _Citations:
    citing: np.ndarray  # paper index
    cited: np.ndarray  # paper index, -1 when unresolved
    n_contexts: np.ndarray
    intents: np.ndarray  # index into _INTENT_SETS; len(_INTENT_SETS) for none
    influential: np.ndarray


def _recent(window: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A position in [0, window), biased toward the end (recent papers)."""
    return np.minimum((window * rng.random(len(window)) ** 0.5).astype(np.int64), window - 1)


def _weighted(
    cum_weight: np.ndarray, lo: np.ndarray, window: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """A position in [0, window) after `lo`, drawn by the weights summed up in `cum_weight`."""
    a, b = cum_weight[lo], cum_weight[lo + window]
    at = np.searchsorted(cum_weight, a + rng.random(len(lo)) * (b - a), side="right") - 1
    return np.clip(at - lo, 0, window - 1)


@dataclass(frozen=True)
class _Ranking:
    """Papers sorted by date within groups (fields, or one group of all), to draw for a citing
    paper an earlier paper of a group: a recent one, or one drawn by fitness."""

    order: np.ndarray  # paper indices sorted by (group, date)
    start: np.ndarray  # per group, its first position in order
    size: np.ndarray  # per group
    rank: np.ndarray  # per paper, its position within its own group
    cum_fitness: np.ndarray  # running sum of fitness along order, from 0

    @classmethod
    def of(
        cls, group: np.ndarray, n_groups: int, date: np.ndarray, fitness: np.ndarray
    ) -> _Ranking:
        order = np.lexsort((date, group))
        start = np.searchsorted(group[order], np.arange(n_groups))
        rank = np.empty(len(group), np.int64)
        rank[order] = np.arange(len(group)) - start[group[order]]
        return cls(
            order=order,
            start=start,
            size=np.bincount(group, minlength=n_groups),
            rank=rank,
            cum_fitness=np.concatenate([[0.0], np.cumsum(fitness[order])]),
        )

    def earlier(
        self, rng: np.random.Generator, citing: np.ndarray, group: np.ndarray
    ) -> np.ndarray:
        """Per citing paper, a paper of `group` before it (when it is in that group and first,
        nothing is earlier: any paper of the group); half recent, half by fitness."""
        lo = self.start[group]
        window = np.where(self.rank[citing] > 0, self.rank[citing], self.size[group])
        by_fitness = rng.random(len(citing)) < 0.5
        at = np.empty(len(citing), np.int64)
        at[by_fitness] = _weighted(self.cum_fitness, lo[by_fitness], window[by_fitness], rng)
        at[~by_fitness] = _recent(window[~by_fitness], rng)
        return self.order[lo + at]


@dataclass(frozen=True)
class _CitationModel:
    """Who cites whom: how many references each paper makes (log-normal), how attractive each is
    to cite (log-normal fitness: the heavy tail of citation counts), in which field."""

    field: np.ndarray
    within_field: _Ranking
    overall: _Ranking
    out_weight: np.ndarray  # sums to 1

    @classmethod
    def of(cls, rng: np.random.Generator, field: np.ndarray, date: np.ndarray) -> _CitationModel:
        out_degree = rng.lognormal(0.0, 1.0, len(field))
        fitness = rng.lognormal(0.0, 1.5, len(field))
        return cls(
            field=field,
            within_field=_Ranking.of(field, len(FIELD_IDS), date, fitness),
            overall=_Ranking.of(np.zeros_like(field), 1, date, fitness),
            out_weight=out_degree / out_degree.sum(),
        )

    def draw(self, rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`k` (citing, cited) pairs, cited -1 when unresolved: an earlier paper of the citing
        field, or of any field for the cross-field share."""
        citing = rng.choice(len(self.field), k, p=self.out_weight)
        cross = rng.random(k) < _CROSS_FIELD_CITATION
        cited = np.empty(k, np.int64)
        cited[~cross] = self.within_field.earlier(rng, citing[~cross], self.field[citing[~cross]])
        cited[cross] = self.overall.earlier(rng, citing[cross], np.zeros(cross.sum(), np.int64))
        cited[rng.random(k) < _UNRESOLVED_CITATION] = -1
        return citing, cited


def _distinct(citing: np.ndarray, cited: np.ndarray, n_papers: int) -> np.ndarray:
    """Positions of the first occurrence of each resolved pair and of every unresolved citation,
    in order; self-citations dropped."""
    resolved = np.flatnonzero((cited >= 0) & (cited != citing))
    _, first_seen = np.unique(citing[resolved] * n_papers + cited[resolved], return_index=True)
    keep = cited < 0
    keep[resolved[first_seen]] = True
    return np.flatnonzero(keep)


def _citations(rng: np.random.Generator, ent: _Entities, n_citations: int) -> _Citations:
    n = ent.n_papers
    model = _CitationModel.of(rng, ent.field[:n], ent.year[:n] * 366 + ent.day[:n])
    citing = cited = np.empty(0, np.int64)
    for _ in range(_CITATION_ROUNDS):  # a dense graph may need more draws to reach n_citations
        missing = n_citations - len(citing)
        if missing <= 0:
            break
        more_citing, more_cited = model.draw(rng, int(missing * 1.1) + 16)
        citing, cited = np.concatenate([citing, more_citing]), np.concatenate([cited, more_cited])
        rows = _distinct(citing, cited, n)
        citing, cited = citing[rows], cited[rows]
    citing, cited = citing[:n_citations], cited[:n_citations]
    m = len(citing)
    n_contexts = np.where(rng.random(m) < 0.6, rng.choice([1, 2, 3], m, p=[0.5, 0.3, 0.2]), 0)
    intents = np.where(
        (n_contexts > 0) & (rng.random(m) < 0.85),
        rng.choice(len(_INTENT_SETS), m, p=[0.55, 0.15, 0.08, 0.12, 0.10]),
        len(_INTENT_SETS),
    )
    return _Citations(
        citing=citing,
        cited=cited,
        n_contexts=n_contexts,
        intents=intents,
        influential=rng.random(m) < np.where(n_contexts > 1, 0.2, 0.05),
    )
