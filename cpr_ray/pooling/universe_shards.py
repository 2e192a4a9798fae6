"""The candidate universe in shards: which paper a shard holds, the memory a shard's index asks
of Ray, and the merge of the shards' ranked lists (pure functions, no Ray).

A pooler whose scores do not depend on the rest of the collection (dense and SPLADE: a
query·document product) searches its index one shard at a time, so no process holds the
whole universe. A paper's shard is a hash of its corpus id (`shard_of`), so a shard needs no
global sort and every shard holds about ``pooling.shard_vectors`` papers. Each shard's lists
are its exact top of each (query, group) in the order one index over the whole universe
ranks them: score descending, then the universe's search order (latest publication day,
then corpus id), which is a paper's own property and so the same in every shard.
`merge_hits` keeps the best `depth` of their union in that order, so the merged lists are
those one unsharded search gives.

BM25's scores do depend on the rest of the collection (IDF and average length are the
collection's), so each shard indexes its texts with the whole universe's statistics
(`retrieval.bm25.CollectionStats`: the number of papers, their total length, and the
document frequencies of the queries' terms, summed over the tasks that write the shards)
and scores each paper exactly as one index over the universe does; it is then sharded like
the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.pooling.pool_schemas import GROUPS, SHARD_HITS
from cpr_ray.pooling.pooler_search import Hits, Universe

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads ids whatever their pattern
MiB = 1 << 20
TASK_BASE = 512 * MiB  # a worker process with pyarrow, faiss and NumPy loaded
# a search actor also holds its query encoder: up to ~350M parameters in float32 with torch
SEARCH_BASE = 2048 * MiB
UNIVERSE_BYTES = 96  # per paper of a loaded shard: ids, days, order, the paper x topic matrices
INDEX_COPIES = 3  # a shard's vectors while it loads: Arrow, the NumPy copy, faiss's own copy
BM25_BYTES = 4096  # per paper a BM25 shard holds: its text, tokens, and score matrix
DOC_BYTES = 2048  # per DOCS row in Arrow: title, abstract, keys (abstracts average ~1.2 kB)


def shard_count(documents: int, shard_vectors: int) -> int:
    """Shards for a universe of `documents` papers, at most about `shard_vectors` each."""
    return max(1, ceil(documents / shard_vectors))


def shard_of(corpus_ids: np.ndarray, shards: int) -> np.ndarray:
    """The shard (0 ≤ s < shards) of each paper: a multiplicative hash of its id, so shards are
    even whatever pattern the ids follow (key buckets are ids modulo a number of buckets)."""
    ids = np.asarray(corpus_ids, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (ids * GOLDEN) >> np.uint64(32)
    return (mixed % np.uint64(shards)).astype(np.int32)


def index_memory(documents: int, bytes_per_document: float, base: int = TASK_BASE) -> int:
    """Bytes to ask of Ray for a process that loads a shard of `documents` papers with vectors
    of `bytes_per_document` (dense: dim x 4; SPLADE: nonzeros x 8): its vectors in the copies a
    load holds at once, the shard's universe, and the process's own `base`."""
    per_document = INDEX_COPIES * bytes_per_document + UNIVERSE_BYTES
    return int(base + ceil(documents * per_document))


def bytes_memory(nbytes: int, base: int = TASK_BASE) -> int:
    """Bytes to ask of Ray for a task that reads a file of `nbytes` and writes it out again in
    parts (a part of the vector store copied to its shards)."""
    return int(base + INDEX_COPIES * nbytes)


def shard_hits(batch: pa.Table, universe: Universe, hits: Hits, pooler: str) -> pa.Table:
    """SHARD_HITS rows of one shard's `hits` for the SEARCH_QUERIES rows of `batch`."""
    return pa.table(
        {
            "query_id": batch["query_id"].take(pa.array(hits.rows)),
            "group": pa.array(GROUPS).take(pa.array(hits.groups)),
            "candidate_id": universe.corpus_ids[hits.positions],
            "pooler": pa.array([pooler]).take(np.zeros(len(hits.rows), np.int64)),
            "rank": hits.ranks.astype(np.int32),
            "score": hits.scores.astype(np.float32),
            "day": universe.days[hits.positions].astype(np.int32),
        },
        schema=SHARD_HITS,
    )


def merge_hits(parts: Sequence[pa.Table], depths: pa.Table) -> pa.Table:
    """One pooler's SHARD_HITS lists from several shards (or a merge so far and one more
    shard), merged per (query, group): the best `depth` of the query by score, then search
    order (day, corpus id), ranked again from 0. `depths` holds (query_id, depth).

    Each part holds at most `depth` entries per (query, group) and its own best ones, so the
    best `depth` of their union are the best of the whole universe."""
    parts = [p.select(SHARD_HITS.names).cast(SHARD_HITS) for p in parts if p.num_rows]
    if not parts:
        return SHARD_HITS.empty_table()
    table = pa.concat_tables(parts).sort_by(
        [
            ("query_id", "ascending"),
            ("group", "ascending"),
            ("score", "descending"),
            ("day", "ascending"),
            ("candidate_id", "ascending"),
        ]
    )
    qid, group = table["query_id"].combine_chunks(), table["group"].combine_chunks()
    n = table.num_rows
    new = np.ones(n, bool)
    if n > 1:
        same = pc.and_(pc.equal(qid[1:], qid[:-1]), pc.equal(group[1:], group[:-1])).to_numpy(
            zero_copy_only=False
        )
        new[1:] = ~same
    starts = np.flatnonzero(new)
    ranks = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    depth = depths["depth"].to_numpy()[pc.index_in(qid, value_set=depths["query_id"]).to_numpy()]
    keep = ranks < depth
    table = table.set_column(
        table.schema.get_field_index("rank"), "rank", pa.array(ranks.astype(np.int32))
    )
    return table.filter(pa.array(keep))
