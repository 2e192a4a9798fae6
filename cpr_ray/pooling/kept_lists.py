"""The ranked lists a run of the pool stage keeps for the next one, and what a refresh reuses of
them (pure functions over Arrow tables, no Ray).

A dense or SPLADE pooler scores a (query, paper) pair from the two vectors alone, so a query's
list over today's universe follows from its list over yesterday's and the papers that changed:

- papers *removed* (deleted, left the universe, or changed in a way the search reads: their
  text's key, their date or their topics) and papers *added* (new, or the changed ones again,
  `universe_delta`);
- a query whose search row is unchanged and whose kept lists hold no removed paper keeps them:
  yesterday's top `depth` of each group, none of them gone, are the top `depth` of what is left
  of yesterday's universe (a subset of it that still holds them), so today's top `depth` is the
  best `depth` of those and of the added papers' own lists, merged by score, then search order
  (`universe_shards.merge_hits`, exactly as the shards of one search are merged);
- every other query (new, its row changed, or a list that lost a paper) is searched in full.

The scores merged are those each search computed from the stored vectors (`query_vectors`, the
documents' store), so kept and new scores of a pair are the same bits. The exception is an IVF
index (``pooling.ivf_min_docs``), whose lists are approximate and depend on the whole index: the
stage does not reuse lists then.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.storage.store import Storage, StorageConfig
from cpr_ray.tables import duckdb_sql as duck

# the SEARCH_QUERIES columns a query's lists depend on (its depth is the pass's)
QUERY_COLUMNS = ("query_id", "query", "base_id", "base_date", "positive_id", "q_topics", "p_topics")


def row_keys(table: pa.Table, columns: Sequence[str]) -> pa.Array:
    """A uint64 key of each row's values in `columns` (MD5-based): equal rows, equal keys."""
    parts = ", ".join(f'coalesce("{c}"::VARCHAR, chr(1))' for c in columns)
    sql = f"SELECT md5_number_lower(concat_ws(chr(0), {parts})) AS key FROM t"
    return duck.query(sql, t=table.select(list(columns)))["key"].combine_chunks()


def universe_delta(
    before: pa.Table, today: pa.Table, columns: Sequence[str]
) -> tuple[np.ndarray, pa.Table]:
    """(removed corpus ids, added rows of `today`) between two DOCS snapshots of the same papers'
    shard: a paper whose values in `columns` differ is both removed and added."""
    old = row_keys(before, ["corpus_id", *columns])
    new = row_keys(today, ["corpus_id", *columns])
    removed = before["corpus_id"].filter(pc.invert(pc.is_in(old, value_set=new)))
    added = today.filter(pc.invert(pc.is_in(new, value_set=old)))
    return removed.to_numpy().astype(np.int64), added


def unchanged_queries(today: pa.Table, kept: pa.Table) -> pa.Array:
    """The query ids of `today`'s SEARCH_QUERIES whose row the kept run searched as it is."""
    same = pc.is_in(row_keys(today, QUERY_COLUMNS), value_set=row_keys(kept, QUERY_COLUMNS))
    return today["query_id"].filter(same).combine_chunks()


def losing_queries(hits: pa.Table, removed: np.ndarray) -> pa.Array:
    """The query ids whose kept lists hold a removed paper."""
    lost = pc.is_in(hits["candidate_id"], value_set=pa.array(removed, pa.int64()))
    return pc.unique(hits["query_id"].filter(lost))


def of_queries(table: pa.Table, query_ids: pa.Array) -> pa.Table:
    """The rows of `table` whose query_id is one of `query_ids`."""
    return table.filter(pc.is_in(table["query_id"], value_set=query_ids))


def shard_delta(
    storage_cfg: StorageConfig,
    before_uri: str | None,
    today_uri: str | None,
    columns: list[str],
    out_uri: str,
) -> tuple[np.ndarray, int]:
    """One shard's `universe_delta` as a task: yesterday's DOCS folder of the shard against
    today's (either None when that run's shard held no paper), the added rows written to
    `out_uri` (DOCS rows with their keys, what a search actor loads); returns the removed ids
    and the number of added rows."""
    storage = Storage(storage_cfg)
    read = ["corpus_id", *columns]
    before = storage.read_parquet(before_uri, read) if before_uri else None
    today = storage.read_parquet(today_uri) if today_uri else None
    if today is None:
        assert before is not None
        return before["corpus_id"].to_numpy().astype(np.int64), 0
    if before is None:
        before = today.select(read).slice(0, 0)
    removed, added = universe_delta(before, today, columns)
    if added.num_rows:
        storage.write_parquet(added, out_uri)
    return removed, added.num_rows
