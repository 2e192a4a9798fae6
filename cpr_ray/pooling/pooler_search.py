"""One pooler's ranked lists per query and group over the candidate universe (NumPy/SciPy, no Ray).

Each query gets, from each pooler, three lists — one per group — of the `depth` best-scoring
eligible papers of that group. The filters run inside the search, so neither the date nor the
groups can starve a query the way filtering a fixed top-k afterwards would:

- the universe is ordered by latest publication day, so the papers published before a query are
  a prefix of it (the query's `cutoff`); its positive is excluded by position;
- groups 1 and 2 (a topic shared with q; a topic shared only with the positive) are enumerated
  from a sparse paper × topic matrix — a few thousand papers per query even in a large universe —
  and every eligible member is scored exactly, whatever the backend;
- group 3 (the rest, most of the universe) is ranked from a masked block of exact scores
  (SPLADE's sparse products, BM25), or from a faiss index searched deeper until each query has
  `depth` eligible results there or the index has no more (dense).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from cpr_ray.retrieval.base import top_k_rows
from cpr_ray.retrieval.faiss_index import VectorIndex

PAIR_CHUNK = 1 << 16  # (query, paper) pairs scored per einsum, bounding the gathered rows' memory
OVERFETCH = 4  # a dense search that found too few eligible papers retries this many times deeper


def _flat_topics(lists: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(row, topic id) of every entry of a list<int32> column (null lists and ids skipped)."""
    arr = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy()
    flat = pc.fill_null(pc.list_flatten(arr), -1).to_numpy().astype(np.int64)
    rows = np.repeat(np.arange(len(arr)), lengths)
    return rows[flat >= 0], flat[flat >= 0]


class Universe:
    """The candidate universe in search order: by latest publication day, then corpus id.

    Built from DOCS rows (corpus_id, date_key, topic_ids); `order[i]` is the input row at
    position i, so any other column (texts) can be put in search order with one take.
    """

    def __init__(self, docs: pa.Table) -> None:
        ids = docs["corpus_id"].to_numpy()
        days = pc.cast(docs["date_key"], pa.int32()).to_numpy()
        self.order = np.lexsort((ids, days))  # (N,)
        self.corpus_ids = ids[self.order]
        self.days = days[self.order]
        topics = docs["topic_ids"].combine_chunks().take(pa.array(self.order))
        rows, flat = _flat_topics(topics)
        self.topic_ids = np.unique(flat)  # (T,) the topics any candidate has
        self.topics = sp.csr_matrix(
            (np.ones(len(flat), np.float32), (rows, np.searchsorted(self.topic_ids, flat))),
            shape=(len(ids), len(self.topic_ids)),
        )  # (N, T)
        self.topics_t = self.topics.T.tocsr()  # (T, N)
        self._by_id = np.argsort(self.corpus_ids, kind="stable")
        self._sorted_ids = self.corpus_ids[self._by_id]

    def __len__(self) -> int:
        return len(self.corpus_ids)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Position of each corpus id in search order; -1 for an id outside the universe."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(self) == 0:
            return np.full(ids.shape, -1, np.int64)
        idx = np.minimum(np.searchsorted(self._sorted_ids, ids), len(self) - 1)
        return np.where(self._sorted_ids[idx] == ids, self._by_id[idx], -1)

    def topic_matrix(self, lists: pa.Array | pa.ChunkedArray) -> sp.csr_matrix:
        """(rows, T) indicator of each row's topics; topics no candidate has are dropped."""
        rows, flat = _flat_topics(lists)
        cols = np.searchsorted(self.topic_ids, flat)
        known = cols < len(self.topic_ids)
        known[known] = self.topic_ids[cols[known]] == flat[known]
        return sp.csr_matrix(
            (np.ones(int(known.sum()), np.float32), (rows[known], cols[known])),
            shape=(len(lists), len(self.topic_ids)),
        )


def _in_sorted(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Membership of `keys` in an already sorted array (binary search; np.isin would hash both)."""
    if len(sorted_keys) == 0:
        return np.zeros(keys.shape, bool)
    idx = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[idx] == keys


def _pairs(matrix: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of the nonzeros in row-major order, so row·n + column comes out sorted."""
    matrix.sort_indices()
    coo = matrix.tocoo()
    return coo.row.astype(np.int64), coo.col.astype(np.int64)


@dataclass(frozen=True)
class QueryBatch:
    """What a search needs of a batch of queries, in universe positions."""

    cutoff: np.ndarray  # (c,) papers published before each query: positions [0, cutoff)
    excluded: np.ndarray  # (c,) position of each query's positive; -1 when not a candidate
    depth: np.ndarray  # (c,) list length wanted per group
    members: tuple[tuple[np.ndarray, np.ndarray], ...]  # groups 1, 2: eligible (row, position)

    @classmethod
    def build(cls, universe: Universe, table: pa.Table) -> QueryBatch:
        """From SEARCH_QUERIES rows. A query without a date precedes nothing it can be shown to."""
        days = pc.cast(table["base_date"], pa.int32())
        cutoff = np.searchsorted(universe.days, pc.fill_null(days, 0).to_numpy(), side="left")
        cutoff = np.where(pc.is_valid(days).to_numpy(zero_copy_only=False), cutoff, 0)
        excluded = universe.positions(table["positive_id"].to_numpy())
        shares_q = universe.topic_matrix(table["q_topics"]) @ universe.topics_t  # (c, N)
        shares_p = universe.topic_matrix(table["p_topics"]) @ universe.topics_t  # (c, N)
        n = len(universe)
        rows_q, cols_q = _pairs(shares_q)
        rows_p, cols_p = _pairs(shares_p)
        only_p = ~_in_sorted(rows_p * n + cols_p, rows_q * n + cols_q)  # group 1 wins
        members = []
        for rows, cols in ((rows_q, cols_q), (rows_p[only_p], cols_p[only_p])):
            ok = (cols < cutoff[rows]) & (cols != excluded[rows])
            members.append((rows[ok], cols[ok]))
        depth = table["depth"].to_numpy().astype(np.int64)
        return cls(cutoff.astype(np.int64), excluded, depth, tuple(members))

    def __len__(self) -> int:
        return len(self.cutoff)

    def member_keys(self, n: int) -> np.ndarray:
        """Sorted row·n + position of every group 1 and 2 member, for membership tests."""
        keys = [rows * n + cols for rows, cols in self.members]
        return np.sort(np.concatenate(keys))


@dataclass(frozen=True)
class Hits:
    """Ranked-list entries: query row in its batch, group code (GROUPS index), position, rank,
    and the score it was ranked by (what merging the lists of several shards compares)."""

    rows: np.ndarray
    groups: np.ndarray
    positions: np.ndarray
    ranks: np.ndarray
    scores: np.ndarray

    @classmethod
    def of(
        cls,
        group: int,
        rows: np.ndarray,
        positions: np.ndarray,
        ranks: np.ndarray,
        scores: np.ndarray,
    ) -> Hits:
        return cls(rows, np.full(len(rows), group, np.int8), positions, ranks, scores)

    @classmethod
    def concat(cls, parts: list[Hits]) -> Hits:
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))


def top_k_pairs(
    rows: np.ndarray, cols: np.ndarray, scores: np.ndarray, depth: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row, its `depth[row]` best-scoring pairs (non-finite scores dropped; equal scores to
    the lower column): (rows, cols, ranks from 0, scores)."""
    keep = np.isfinite(scores)
    rows, cols, scores = rows[keep], cols[keep], scores[keep]
    order = np.lexsort((cols, -scores, rows))
    rows, cols, scores = rows[order], cols[order], scores[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else np.zeros(0, int)
    ranks = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
    keep = ranks < depth[rows]
    return rows[keep], cols[keep], ranks[keep], scores[keep]


def _topic_group_hits(batch: QueryBatch, pair_scores) -> list[Hits]:
    out = []
    for group, (rows, cols) in enumerate(batch.members):
        out.append(Hits.of(group, *top_k_pairs(rows, cols, pair_scores(rows, cols), batch.depth)))
    return out


def exact_hits(scores: np.ndarray, batch: QueryBatch, *, positive_only: bool) -> Hits:
    """Ranked lists from a (c, N) block of exact scores. `positive_only` (sparse and lexical
    scores) keeps only papers scoring above zero: one sharing no term is not retrieved."""
    c, n = scores.shape
    if positive_only:
        scores = np.where(scores > 0, scores, -np.inf)
    parts = _topic_group_hits(batch, lambda rows, cols: scores[rows, cols])
    valid = np.arange(n)[None, :] < batch.cutoff[:, None]  # (c, N) published before q
    has = batch.excluded >= 0
    valid[np.flatnonzero(has), batch.excluded[has]] = False
    for rows, cols in batch.members:
        valid[rows, cols] = False
    idx, val = top_k_rows(np.where(valid, scores, -np.inf), int(min(batch.depth.max(), n)))
    ranks = np.broadcast_to(np.arange(idx.shape[1]), idx.shape)
    keep = np.isfinite(val) & (ranks < batch.depth[:, None])
    rows = np.broadcast_to(np.arange(c)[:, None], idx.shape)[keep]
    return Hits.concat([*parts, Hits.of(2, rows, idx[keep], ranks[keep], val[keep])])


def pair_scores(
    queries: np.ndarray, docs: np.ndarray, rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """Inner products of query rows[i] with document cols[i]."""
    out = np.empty(len(rows), np.float32)
    for s in range(0, len(rows), PAIR_CHUNK):
        q, d = queries[rows[s : s + PAIR_CHUNK]], docs[cols[s : s + PAIR_CHUNK]]
        out[s : s + PAIR_CHUNK] = np.einsum("ij,ij->i", q, d)
    return out


def index_hits(
    index: VectorIndex, universe: Universe, queries: np.ndarray, batch: QueryBatch
) -> Hits:
    """Ranked lists of a dense pooler: groups 1 and 2 scored exactly against the index's
    vectors (in universe order), group 3 from the index, searched deeper for the queries whose
    first search held too few eligible papers (old queries, whose cutoff is early).

    Group 3's papers are scored again as groups 1 and 2 are (`pair_scores`) and ranked by that
    score, then search order: faiss's own scores of one pair can differ in the last bit with the
    index's size, and equal scores come back in its order, so a universe searched in shards
    would otherwise rank near-ties differently from one index over all of it."""
    n = len(universe)

    def scores_of(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return pair_scores(queries, index.vectors, rows, cols)

    parts = _topic_group_hits(batch, scores_of)
    members = batch.member_keys(n)
    per_row = np.bincount(np.concatenate([r for r, _ in batch.members]), minlength=len(batch))
    pending = np.arange(len(batch))
    k = int(min(n, 2 * batch.depth.max() + per_row.max(initial=0)))
    found_rows, found_pos = [], []
    while len(pending) and k > 0:
        ids, _ = index.search(queries[pending], k)  # (p, k) corpus ids, -1 past the end
        pos = universe.positions(ids.ravel()).reshape(ids.shape)
        rows = pending[:, None]
        ok = (pos >= 0) & (pos < batch.cutoff[rows]) & (pos != batch.excluded[rows])
        ok &= ~_in_sorted(rows * n + pos, members)
        done = (ok.sum(axis=1) >= batch.depth[pending]) | (k >= n) | (ids[:, -1] < 0)
        take = ok & done[:, None]
        found_rows.append(np.broadcast_to(rows, ids.shape)[take])
        found_pos.append(pos[take])
        pending, k = pending[~done], min(n, k * OVERFETCH)
    if found_rows:
        rows, cols = np.concatenate(found_rows), np.concatenate(found_pos)
        parts.append(Hits.of(2, *top_k_pairs(rows, cols, scores_of(rows, cols), batch.depth)))
    return Hits.concat(parts)
