"""The key table: every paper's DOI, MAG and PubMed keys (as `linking.s2_keys` makes them) →
its corpus id, a Lance table in the key buckets the OpenAlex key table uses.

Why it exists: a new OpenAlex partition relinks the papers that carry one of its keys. Without
this table every papers bucket had to read its papers' identifiers and look them up, a read of
the whole corpus for a partition of a few thousand works; with it, each key bucket the new keys
fall in looks them up in its own bucket of this table and the relink edits only the papers
found (`release_step.stage_relinks`).

It always holds the keys of the papers table's current rows, exactly: ingest writes it from the
assembled papers (`build`), each refresh step's papers edit hands over the keys its rewritten and
deleted papers lost and gained (`key_delta`), which are applied in the key buckets they hash to
and committed with the step (`apply_delta`); a killed step's edit is restored with the papers
table's. A corpus ingested before this table existed gets it built once, by its first refresh
(the same `build`, from the papers table).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.corpus import bucket_edits, linking
from cpr_ray.storage.store import Storage
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import (
    BUCKET,
    BucketLayout,
    BucketPlan,
    read_lance_bucket,
    read_parquet_bucket,
    run_buckets,
    write_bucketed_table,
    write_partitions,
)

TABLE = "paper_keys"
KEY_BUCKET = "key_bucket"  # the layout's key: `key_bucket % n == key_bucket`
SCHEMA = pa.schema([("key", pa.string()), ("corpus_id", pa.int64()), (KEY_BUCKET, pa.int32())])
ON = ["key", "corpus_id"]
IDENTIFIERS = ["corpus_id", "doi", "mag_id", "pmid"]
HAS_KEY = " OR ".join(f"{c} IS NOT NULL" for c in IDENTIFIERS[1:])
STAGED = pa.schema([*SCHEMA, pa.field("gained", pa.bool_())])  # a delta, staged by key bucket


def key_rows(papers: pa.Table, key_buckets: int) -> pa.Table:
    """Papers' identifier columns → rows of the key table."""
    keys = linking.s2_keys(papers.select(IDENTIFIERS), key_buckets)
    return pa.table([keys["key"], keys["corpus_id"], keys[BUCKET]], names=SCHEMA.names).cast(SCHEMA)


def key_delta(before: pa.Table, after: pa.Table, key_buckets: int) -> pa.Table:
    """The key rows papers gain (`gained`) and lose when their rows `before` become `after`
    (a deleted paper has no row after), with the key bucket each goes to (`_bucket`)."""
    delta = duck.query(
        """SELECT *, true AS gained FROM (SELECT * FROM new EXCEPT SELECT * FROM old)
        UNION ALL
        SELECT *, false AS gained FROM (SELECT * FROM old EXCEPT SELECT * FROM new)""",
        new=key_rows(after, key_buckets),
        old=key_rows(before, key_buckets),
    ).cast(STAGED)
    return delta.append_column(BUCKET, delta[KEY_BUCKET])


def _stage_bucket(
    k: int, *, papers: BucketPlan, storage: Storage, out: str, key_buckets: int
) -> None:
    """Papers bucket k's key rows, into the key buckets of `out`."""
    rows = key_rows(read_lance_bucket(papers, storage, k, IDENTIFIERS, HAS_KEY), key_buckets)
    if rows.num_rows:
        write_partitions(rows.append_column(BUCKET, rows[KEY_BUCKET]), out, storage, str(k))


def _staged(j: int, *, storage: Storage, staged: str) -> pa.Table:
    return read_parquet_bucket(storage, staged, j, SCHEMA)


def build(
    storage: Storage,
    papers: BucketPlan,
    uri: str,
    key_buckets: int,
    staging: str,
    *,
    cpus: float,
    fragment_rows: int,
) -> BucketLayout:
    """The key table of the papers at `papers`' version, written at `uri` (a task per papers
    bucket keys its papers into the key buckets of `staging`, then a task per key bucket writes
    its Lance fragments); returns its layout."""
    storage.delete_dir(staging)
    stage = partial(_stage_bucket, papers=papers, storage=storage, out=staging)
    run_buckets(papers.layout.num_buckets, partial(stage, key_buckets=key_buckets), cpus)
    layout, _ = write_bucketed_table(
        key_buckets,
        partial(_staged, storage=storage, staged=staging),
        uri,
        SCHEMA,
        key=KEY_BUCKET,
        fragment_rows=fragment_rows,
        storage=storage,
        cpus=cpus,
    )
    storage.delete_dir(staging)
    return layout


def find(p: BucketPlan, storage: Storage, j: int, keys: pa.Array) -> pa.Table:
    """Key bucket j's rows of the key table whose key is among `keys`."""
    where = pc.field("key").isin(keys)
    return bucket_edits.current_rows(p, storage, j, where, SCHEMA.names).select(SCHEMA.names)


def edit_bucket(
    j: int, *, p: BucketPlan, storage: Storage, delta: pa.Table, fragment_rows: int
) -> bucket_edits.BucketEdit:
    """Key bucket j of the key table with its share of a step's delta (`key_delta`, read from
    its staged bucket) applied."""
    gained = delta.filter(delta["gained"]).select(SCHEMA.names)
    lost = delta.filter(pc.invert(delta["gained"])).select(ON)
    keys = pa.concat_arrays([gained["key"].combine_chunks(), lost["key"].combine_chunks()])
    current = bucket_edits.current_rows(
        p, storage, j, pc.field("key").isin(keys.unique()), SCHEMA.names
    )
    return bucket_edits.edit_bucket(
        p, storage, j, current, gained, lost, on=ON, fragment_rows=fragment_rows
    )


def staged_delta(storage: Storage, staged: str, j: int) -> pa.Table:
    """Key bucket j's share of a step's staged delta."""
    return read_parquet_bucket(storage, staged, j, STAGED)


def touched(rows_by_bucket: dict[int, int]) -> Sequence[int]:
    return sorted(j for j, n in rows_by_bucket.items() if n)
