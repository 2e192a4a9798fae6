"""The one internal form every benchmark loads into.

Documents live in one table (``doc_ids``/``doc_texts``); everything else refers to a document by
its *position* in that table, so scoring and metrics work on integer arrays. A benchmark either
gives each query its own candidate pool (CPR-eval, AnaloBench: ``pools``, a padded matrix with
-1 past a pool's end) or is searched over the whole corpus (BEIR, BRIGHT: ``pools is None``).
Relevance is graded: a grade >= 1 is relevant, 0 is judged non-relevant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cpr_ray.errors import InputError
from cpr_ray.retrieval.base import PAD


@dataclass
class Benchmark:
    name: str  # e.g. "cpr", "analobench:t2", "beir:scifact", "bright:biology"
    query_ids: list[str]
    queries: list[str]
    doc_ids: list[str]
    doc_texts: list[str]
    qrels: list[dict[int, int]]  # per query: doc position -> grade
    pools: np.ndarray | None = None  # (n_queries, max_pool) int64 doc positions, PAD-padded
    pool_groups: np.ndarray | None = None  # (n_queries, max_pool) candidate group labels (CPR)
    excluded: list[np.ndarray] | None = None  # per query: doc positions never to be returned
    domains: list[str | None] | None = None  # per query (OpenAlex domain for CPR-eval)
    meta: dict[str, list] = field(default_factory=dict)  # further per-query columns
    train_pairs: list[tuple[str, str]] = field(default_factory=list)  # (query, passage) few-shot
    rejects: list[dict[str, str]] = field(default_factory=list)  # malformed input records
    primary_metric: str = "recall_at_10"

    def __post_init__(self) -> None:
        n = len(self.query_ids)
        if len(self.queries) != n or len(self.qrels) != n:
            raise ValueError(f"{self.name}: queries, query_ids and qrels differ in length")
        if len(self.doc_ids) != len(self.doc_texts):
            raise ValueError(f"{self.name}: doc_ids and doc_texts differ in length")
        if self.pools is not None:
            if self.pools.ndim != 2 or self.pools.shape[0] != n:
                raise ValueError(f"{self.name}: pools must be (n_queries, max_pool)")
            if self.pool_groups is not None and self.pool_groups.shape != self.pools.shape:
                raise ValueError(f"{self.name}: pool_groups must have the shape of pools")
        if self.domains is not None and len(self.domains) != n:
            raise ValueError(f"{self.name}: domains must have one entry per query")
        for key, values in self.meta.items():
            if len(values) != n:
                raise ValueError(f"{self.name}: meta column {key!r} needs one entry per query")

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)

    @property
    def has_pools(self) -> bool:
        return self.pools is not None

    def pool_sizes(self) -> np.ndarray:
        """Candidates each query ranks: its pool, or the corpus less its excluded documents."""
        if self.pools is not None:
            return (self.pools != PAD).sum(axis=1)
        sizes = np.full(self.n_queries, len(self.doc_ids), dtype=np.int64)
        if self.excluded is not None:
            sizes -= np.array([len(e) for e in self.excluded], dtype=np.int64)
        return sizes


def pad_pools(pools: Sequence[Sequence[int]]) -> np.ndarray:
    """Ragged lists of doc positions -> a PAD-padded int64 matrix."""
    width = max((len(p) for p in pools), default=0)
    out = np.full((len(pools), width), PAD, dtype=np.int64)
    for i, pool in enumerate(pools):
        out[i, : len(pool)] = pool
    return out


def require_unique(ids: Sequence[str], where: str) -> None:
    """Each id once: a document or query listed twice would be ranked or scored twice (MTEB,
    whose corpora and candidate lists are keyed by id, counts it once), and which of its two
    texts is meant is the user's to say."""
    repeated = [i for i, c in Counter(ids).items() if c > 1]
    if repeated:
        raise InputError(
            f"{where}: {len(repeated)} id(s) listed more than once (the first: {repeated[0]!r}); "
            "list each once"
        )


def positions(doc_ids: Sequence[str]) -> dict[str, int]:
    """Document id -> position; duplicate ids are a loader bug, so they raise."""
    index = {d: i for i, d in enumerate(doc_ids)}
    if len(index) != len(doc_ids):
        raise ValueError("duplicate document ids in the benchmark's document table")
    return index


def qrels_by_position(
    qrels: Mapping[str, Mapping[str, int]], query_ids: Sequence[str], index: Mapping[str, int]
) -> tuple[list[dict[int, int]], int]:
    """Qrels keyed by ids -> per query {position: grade}; returns how many pairs named no doc."""
    out: list[dict[int, int]] = []
    missing = 0
    for qid in query_ids:
        row: dict[int, int] = {}
        for did, grade in qrels.get(qid, {}).items():
            pos = index.get(did)
            if pos is None:
                missing += 1
            else:
                row[pos] = int(grade)
        out.append(row)
    return out, missing
