"""Upserts and deletes of a key-bucketed corpus table, one Ray task per key bucket, published as
one Lance transaction.

Lance's own ``merge_insert`` joins the incoming rows against the key column of the *whole*
table in one process (a hash table of 2.5B citation keys at full scale), and a BTREE index on the
key, its alternative, was slower here than that scan for a diff of 20k rows over 10M (0.84 s
against 0.30 s; per row looked up ~1,400× a scanned row's cost, so it loses at a ~1% diff) and
~75× slower on S3 (reference TABLES_NOTES). The tables are bucketed by key instead
(`buckets`): bucket k's rows live in bucket k's fragments (plus, in a table an older refresh
appended to, fragments that mix buckets, read with the bucket predicate). So a bucket's task
finds the rows a diff touches by scanning only its own fragments (`current_rows`), and writes
its edit by hand (`edit_bucket`), as ``merge_insert`` would: the old rows get deletion marks,
the new rows go into new fragments of that bucket only — updated rows first, carrying their
stable row ids, so Lance's change API still tells updated from inserted — and only the
fragments' metadata goes back to the driver, which commits every bucket's edit at once
(`commit`) and records the new fragments in the table's bucket layout.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import RowIdSequence, write_fragments

from cpr_ray.storage.store import Storage
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import BucketLayout, BucketPlan, planned_fragment

ROW_ID, ROW_ADDR = "_rowid", "_rowaddr"


@dataclass(frozen=True)
class BucketEdit:
    """What one bucket's task hands back: fragment metadata and counts, never rows."""

    bucket: int
    updated: tuple[bytes, ...] = ()  # its own fragments with their new deletion marks
    removed: tuple[int, ...] = ()  # its own fragments left without a row
    new: tuple[bytes, ...] = ()  # fragments of the rows it wrote (this bucket's rows only)
    # rows to delete in fragments that mix buckets (fragment id → row offsets): several buckets
    # may mark the same such fragment, so the commit merges their marks
    mixed: dict[int, list[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # inserted / updated / deleted


def bucket_scanners(
    p: BucketPlan, storage: Storage, k: int, where: pc.Expression, columns: Sequence[str]
) -> list[tuple[lance.LanceScanner, bool]]:
    """The scans that find bucket k's rows matching `where`: one over its own fragments and one
    over the fragments that mix buckets (True: its rows must still be picked out) — no other
    fragment is read."""
    ds = storage.open_lance(p.uri, p.version)
    return [
        (
            ds.scanner(
                fragments=[planned_fragment(ds, i) for i in ids],
                columns=list(dict.fromkeys([*columns, p.layout.key])),
                filter=where,
                with_row_id=True,
                with_row_address=True,
            ),
            mixed,
        )
        for ids, mixed in ((p.by_bucket[k], False), (p.mixed, True))
        if ids
    ]


def current_rows(
    p: BucketPlan, storage: Storage, k: int, where: pc.Expression, columns: Sequence[str]
) -> pa.Table:
    """Bucket k's rows matching `where`, with their stable row id and address."""
    parts = []
    for scanner, mixed in bucket_scanners(p, storage, k, where, columns):
        found = scanner.to_table()
        if mixed:  # other buckets' rows too: keep bucket k's
            key = found[p.layout.key].to_numpy(zero_copy_only=False)
            found = found.filter(pa.array(key % p.layout.num_buckets == k))
        parts.append(found.select([*columns, ROW_ID, ROW_ADDR]))
    if parts:
        return pa.concat_tables(parts)
    ds = storage.open_lance(p.uri, p.version)
    schema = pa.schema([ds.schema.field(c) for c in columns])
    return (
        schema.append(pa.field(ROW_ID, pa.uint64()))
        .append(pa.field(ROW_ADDR, pa.uint64()))
        .empty_table()
    )


def edit_bucket(
    p: BucketPlan,
    storage: Storage,
    k: int,
    current: pa.Table,
    rows: pa.Table,
    gone: pa.Table,
    *,
    on: Sequence[str],
    fragment_rows: int,
) -> BucketEdit:
    """Bucket k's share of an upsert of `rows` and a delete of the keys in `gone` (`on`
    columns), given the bucket's `current` rows for those keys (`current_rows`): the current
    rows with any of those keys are marked deleted, and `rows` written as new fragments, those
    replacing a current row first with its row id."""
    keys = ", ".join(on)
    hit = duck.query(
        f"""SELECT c.{ROW_ID}, c.{ROW_ADDR}, {", ".join(f"c.{col}" for col in on)},
            n.{on[0]} IS NOT NULL AS rewritten
        FROM cur c
        LEFT JOIN (SELECT DISTINCT {keys} FROM rows) n USING ({keys})
        LEFT JOIN (SELECT DISTINCT {keys} FROM gone) g USING ({keys})
        WHERE n.{on[0]} IS NOT NULL OR g.{on[0]} IS NOT NULL""",
        cur=current.select([ROW_ID, ROW_ADDR, *on]),
        rows=rows.select(list(on)),
        gone=gone.select(list(on)),
    )
    ordered = duck.query(
        f"""SELECT r.*, h.{ROW_ID} AS __id FROM rows r
        LEFT JOIN (SELECT * FROM hit WHERE rewritten) h USING ({keys})
        ORDER BY h.{ROW_ID} IS NULL, h.{ROW_ID}""",
        rows=rows,
        hit=hit,
    )
    carried = ordered["__id"].drop_null()
    schema = storage.open_lance(p.uri, p.version).schema
    new = _write(p, storage, ordered.drop_columns(["__id"]), schema, carried, fragment_rows)
    updated, removed, mixed = _mark_deleted(p, storage, k, hit[ROW_ADDR])
    n_rewritten = len(carried)
    return BucketEdit(
        k,
        updated,
        removed,
        new,
        mixed,
        {
            "inserted": rows.num_rows - n_rewritten,
            "updated": n_rewritten,
            "deleted": hit.num_rows - n_rewritten,
        },
    )


def changed_keys(
    current: pa.Table, rows: pa.Table, gone: pa.Table, on: Sequence[str]
) -> tuple[pa.Table, pa.Table]:
    """The keys (`on` columns) an edit of `current` rows by `rows` and `gone` (`edit_bucket`)
    really changes: those of `rows` that are new or differ in any column from the current row
    with their keys, and those of current rows it deletes (in `gone`, not written again). A row
    written as it was is no change."""
    keys, cols = ", ".join(on), ", ".join(rows.column_names)
    written = duck.query(
        f"SELECT DISTINCT {keys} FROM (SELECT {cols} FROM rows EXCEPT SELECT {cols} FROM cur)",
        rows=rows,
        cur=current.select(rows.column_names).cast(rows.schema),
    )
    deleted = duck.query(
        f"""SELECT DISTINCT {keys} FROM cur
        SEMI JOIN gone USING ({keys}) ANTI JOIN rows USING ({keys})""",
        cur=current.select(list(on)),
        gone=gone.select(list(on)),
        rows=rows.select(list(on)),
    )
    return written, deleted


def _write(
    p: BucketPlan,
    storage: Storage,
    rows: pa.Table,
    schema: pa.Schema,
    carried: pa.Array,
    fragment_rows: int,
) -> tuple[bytes, ...]:
    """`rows` as new fragments; the first `len(carried)` keep those row ids."""
    if not rows.num_rows:
        return ()
    fragments = write_fragments(
        rows.select(schema.names).cast(schema),
        p.uri,
        schema=schema,
        max_rows_per_file=fragment_rows,
        enable_stable_row_ids=True,
        storage_options=storage.lance_options(p.uri),
    )
    start = 0
    for fragment in fragments:
        ids = carried[start : start + fragment.physical_rows]
        if len(ids):
            fragment.row_id_meta = RowIdSequence(ids).to_inline_metadata()
        start += fragment.physical_rows
    return tuple(pickle.dumps(f) for f in fragments)


def _mark_deleted(
    p: BucketPlan, storage: Storage, k: int, addresses: pa.ChunkedArray | pa.Array
) -> tuple[tuple[bytes, ...], tuple[int, ...], dict[int, list[int]]]:
    addr = np.asarray(addresses.to_numpy() if len(addresses) else [], dtype=np.uint64)
    by_fragment: dict[int, list[int]] = defaultdict(list)
    for fragment_id, offset in zip((addr >> 32).tolist(), (addr & 0xFFFFFFFF).tolist()):
        by_fragment[fragment_id].append(offset)
    own = set(p.by_bucket[k])
    ds = storage.open_lance(p.uri, p.version)
    updated, removed, mixed = [], [], {}
    for fragment_id, offsets in sorted(by_fragment.items()):
        if fragment_id not in own:
            mixed[fragment_id] = offsets
            continue
        marked = planned_fragment(ds, fragment_id).delete_rows(offsets)
        if marked is None:
            removed.append(fragment_id)
        else:
            updated.append(pickle.dumps(marked))
    return tuple(updated), tuple(removed), mixed


def commit(p: BucketPlan, storage: Storage, edits: Sequence[BucketEdit]) -> BucketLayout:
    """Every bucket's edit as one new version of the table (a failed task publishes nothing);
    returns the layout with the new fragments in their buckets and the removed ones gone."""
    ds = storage.open_lance(p.uri, p.version)
    updated = [pickle.loads(b) for e in edits for b in e.updated]
    removed = [i for e in edits for i in e.removed]
    new, bucket_of = [], {}
    for e in edits:
        for blob in e.new:
            fragment = pickle.loads(blob)
            new.append(fragment)
            bucket_of[fragment.files[0].path] = e.bucket
    mixed: dict[int, list[int]] = defaultdict(list)
    for e in edits:
        for fragment_id, offsets in e.mixed.items():
            mixed[fragment_id].extend(offsets)
    for fragment_id, offsets in mixed.items():
        marked = planned_fragment(ds, fragment_id).delete_rows(offsets)
        if marked is None:
            removed.append(fragment_id)
        else:
            updated.append(marked)
    if not (updated or removed or new):
        return p.layout
    update = lance.LanceOperation.Update(
        removed_fragment_ids=removed, updated_fragments=updated, new_fragments=new
    )
    done = storage.commit_lance(  # made again, once, where S3 broke off Lance's listing
        p.uri,
        lambda: lance.LanceDataset.commit(
            p.uri, update, read_version=p.version, storage_options=storage.lance_options(p.uri)
        ),
    )
    live = {f.metadata.files[0].path for f in done.get_fragments() if f.metadata.files}
    files = {path: b for path, b in {**p.layout.files, **bucket_of}.items() if path in live}
    return BucketLayout(p.layout.key, p.layout.num_buckets, files)


def total(edits: Sequence[BucketEdit]) -> dict[str, int]:
    """Rows inserted, updated and deleted by all buckets' edits: what Lance's change API would
    count between the versions before and after the commit, without reading a row."""
    return {c: sum(e.counts.get(c, 0) for e in edits) for c in ("inserted", "updated", "deleted")}
