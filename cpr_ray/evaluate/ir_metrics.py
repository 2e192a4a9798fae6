"""Ranking metrics as pure NumPy over judged rankings, and their expectation under random ranking.

Definitions (checked against ranx on the same runs in ``tests/evaluate/test_evaluate_metrics.py``):

- a document is relevant when its grade is >= 1;
- Recall@k = relevant documents in the top k / relevant documents of the query (k = 1, 5, 10 and
  100: the last says how much a reranker over the top 100 could still recover);
- MRR@10 = 1 / rank of the first relevant document within the top 10, else 0;
- nDCG@10 = DCG@10 / ideal DCG@10 with DCG = sum gain(grade_i) / log2(i + 1) over ranks i = 1..10;
  gain is 2^grade - 1 ("exponential", ranx ``ndcg_burges``, the default) or the grade itself
  ("linear", ranx/trec_eval ``ndcg``, the form BEIR and BRIGHT publish). Both coincide for
  binary relevance (CPR-eval, AnaloBench).

Each metric is computed per query and averaged; a query without any relevant document has no
defined recall and must be left out (and counted) before judging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

RECALL_AT = (1, 5, 10, 100)
METRICS = (*(f"recall_at_{k}" for k in RECALL_AT), "mrr_at_10", "ndcg_at_10")
DEPTH = max(RECALL_AT)  # ranks judged
CUTOFF = 10  # of MRR and nDCG
Gain = Literal["exponential", "linear"]


@dataclass(frozen=True)
class Judged:
    """A run reduced to what the metrics need."""

    ranked_grades: np.ndarray  # (n_q, depth) grade at ranks 1..depth; 0 for misses and padding
    n_relevant: np.ndarray  # (n_q,) documents with grade >= 1 in the qrels
    ideal_grades: np.ndarray  # (n_q, CUTOFF) the qrels' grades, best first, zero-padded


def judge(
    ranked: Sequence[np.ndarray], qrels: Sequence[Mapping[int, int]], depth: int = DEPTH
) -> Judged:
    """Look up the grade of each of the top `depth` documents of every query."""
    if len(ranked) != len(qrels):
        raise ValueError(f"{len(ranked)} rankings for {len(qrels)} queries")
    n = len(qrels)
    grades = np.zeros((n, depth), dtype=np.float64)
    ideal = np.zeros((n, CUTOFF), dtype=np.float64)
    n_rel = np.zeros(n, dtype=np.int64)
    for i, (docs, rel) in enumerate(zip(ranked, qrels)):
        top = docs[:depth]
        grades[i, : len(top)] = [max(rel.get(int(d), 0), 0) for d in top]
        best = sorted((g for g in rel.values() if g > 0), reverse=True)[:CUTOFF]
        ideal[i, : len(best)] = best
        n_rel[i] = sum(1 for g in rel.values() if g >= 1)
    if (n_rel == 0).any():
        bad = int(np.flatnonzero(n_rel == 0)[0])
        raise ValueError(
            f"query #{bad} has no relevant document; leave such queries out before judging"
        )
    return Judged(grades, n_rel, ideal)


def _gain(grades: np.ndarray, gain: Gain) -> np.ndarray:
    if gain == "exponential":
        return np.power(2.0, grades) - 1.0
    if gain == "linear":
        return grades
    raise ValueError(f"unknown gain {gain!r}; use 'exponential' or 'linear'")


def discounts(depth: int = DEPTH) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, depth + 2))


def per_query(j: Judged, gain: Gain = "exponential") -> dict[str, np.ndarray]:
    """Every metric of METRICS for every query (arrays of shape (n_q,))."""
    relevant = j.ranked_grades >= 1  # (n_q, depth)
    hits = np.cumsum(relevant, axis=1)  # (n_q, depth) relevant within the top i
    depth = relevant.shape[1]
    out = {f"recall_at_{k}": hits[:, min(k, depth) - 1] / j.n_relevant for k in RECALL_AT}
    head = relevant[:, :CUTOFF]
    first = np.where(head.any(axis=1), head.argmax(axis=1), -1)  # (n_q,)
    out["mrr_at_10"] = np.divide(1.0, first + 1.0, out=np.zeros(len(first)), where=first >= 0)
    disc = discounts(CUTOFF)  # (CUTOFF,)
    grades = j.ranked_grades[:, :CUTOFF]
    if grades.shape[1] < CUTOFF:
        grades = np.pad(grades, ((0, 0), (0, CUTOFF - grades.shape[1])))
    dcg = (_gain(grades, gain) * disc).sum(axis=1)  # (n_q,)
    idcg = (_gain(j.ideal_grades, gain) * disc).sum(axis=1)  # (n_q,)
    out["ndcg_at_10"] = np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0)
    return out


def random_expectation(
    pool_sizes: np.ndarray,
    pool_grades: Sequence[np.ndarray],
    n_relevant: np.ndarray,
    ideal_grades: np.ndarray,
    gain: Gain = "exponential",
) -> dict[str, np.ndarray]:
    """Expected per-query metrics when each query's pool is ranked uniformly at random.

    `pool_sizes` (n_q,): candidates ranked; `pool_grades`: per query, the grades (>= 1) of the
    relevant documents that are in its pool; `n_relevant` (n_q,): relevant documents in the qrels
    (a relevant document outside the pool can never be retrieved); `ideal_grades` as in
    :class:`Judged`. With n candidates of which r
    relevant are in the pool: E[Recall@k] = (r / n_relevant) * min(k, n) / n; E[MRR@10] sums
    P(first relevant at rank i) / i with P = r / (n - i + 1) * prod_{j < i-1} (n - r - j) / (n - j);
    E[nDCG@10] = mean gain over the pool * sum of the first min(10, n) discounts / ideal DCG.
    """
    n = np.asarray(pool_sizes, dtype=np.float64)
    r = np.array([len(g) for g in pool_grades], dtype=np.float64)
    share = r / np.asarray(n_relevant, dtype=np.float64)
    out = {f"recall_at_{k}": share * np.minimum(k, n) / n for k in RECALL_AT}
    mrr = np.zeros_like(n)
    survive = np.ones_like(n)  # P(no relevant document in ranks 1..i-1)
    for i in range(1, CUTOFF + 1):
        left = n - i + 1  # candidates still unranked before rank i
        valid = left >= 1
        p_here = np.where(valid, survive * r / np.maximum(left, 1), 0.0)
        mrr += p_here / i
        survive = np.where(valid, survive * (1 - r / np.maximum(left, 1)), 0.0)
    out["mrr_at_10"] = mrr
    disc = discounts(CUTOFF)
    cum_disc = np.cumsum(disc)[np.minimum(n, CUTOFF).astype(int) - 1]  # (n_q,)
    total_gain = np.array([_gain(np.asarray(g, float), gain).sum() for g in pool_grades])
    idcg = (_gain(ideal_grades, gain) * disc).sum(axis=1)  # from the qrels, as in per_query
    expected_dcg = total_gain / n * cum_disc
    out["ndcg_at_10"] = np.divide(
        expected_dcg, idcg, out=np.zeros_like(expected_dcg), where=idcg > 0
    )
    return out
