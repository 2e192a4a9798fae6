"""The corpus tables' one layout: Lance datasets whose fragments each hold one key bucket.

Mining joins papers with the citations *from* them, bucket k against bucket k (PERF_NOTES).
Rather than re-bucketing the corpus into a per-build snapshot (most of mining's time, measured
by benchmarks/mine.py), ingest writes every bucket's rows as fragments of their own — papers by
`corpus_id % n`, citations by `citing_id % n` — and records in its manifest which fragment holds
which bucket, keyed by the fragment's first data file. A reader of bucket k scans exactly those
fragments, with projection and filters pushed into Lance.

The nightly refresh keeps the same tables: its upserts delete rows from their fragments (a
fragment stays one bucket's) and append fragments that mix buckets. Those are not in the
record, so every bucket's reader scans them too, with the bucket predicate pushed down; the
record is never wrong, only incomplete, and a rebuild makes it complete again. `plan` reports
how many rows are read that way, so a growing share is visible.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import lance
import pyarrow as pa
import ray
from lance.fragment import write_fragments

from cpr_ray.storage import Storage


@dataclass(frozen=True)
class BucketLayout:
    """Which fragments of a Lance table hold which key bucket (`key % num_buckets`)."""

    key: str
    num_buckets: int
    files: dict[str, int]  # first data file of a fragment → its bucket

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "num_buckets": self.num_buckets, "files": self.files}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BucketLayout:
        return cls(d["key"], int(d["num_buckets"]), {f: int(b) for f, b in d["files"].items()})


@dataclass(frozen=True)
class BucketPlan:
    """Fragment ids to scan per bucket, and those that mix buckets (scanned with a predicate)."""

    layout: BucketLayout
    uri: str
    version: int
    by_bucket: dict[int, list[int]]
    mixed: list[int]
    mixed_rows: int
    rows: int


def plan(layout: BucketLayout, storage: Storage, uri: str, version: int) -> BucketPlan:
    """Assign the fragments of `uri` at `version` to buckets by the layout's record."""
    ds = storage.open_lance(uri, version)
    by_bucket: dict[int, list[int]] = {k: [] for k in range(layout.num_buckets)}
    mixed: list[int] = []
    mixed_rows = rows = 0
    for fragment in ds.get_fragments():
        files = fragment.metadata.data_files()
        bucket = layout.files.get(files[0].path) if files else None
        n = fragment.count_rows()
        rows += n
        if bucket is None:
            mixed.append(fragment.fragment_id)
            mixed_rows += n
        else:
            by_bucket[bucket].append(fragment.fragment_id)
    return BucketPlan(layout, uri, version, by_bucket, mixed, mixed_rows, rows)


def schema(p: BucketPlan, storage: Storage, columns: list[str]) -> pa.Schema:
    ds = storage.open_lance(p.uri, p.version)
    return pa.schema([ds.schema.field(c) for c in columns])


def read_bucket(
    p: BucketPlan,
    storage: Storage,
    k: int,
    columns: list[str],
    where: str | None = None,
) -> pa.Table:
    """Rows of bucket k: its own fragments, plus bucket k's rows of the mixed ones."""
    ds = storage.open_lance(p.uri, p.version)
    schema = pa.schema([ds.schema.field(c) for c in columns])
    parts = []
    bucket_rows = f"{p.layout.key} % {p.layout.num_buckets} = {k}"
    for ids, predicate in ((p.by_bucket[k], where), (p.mixed, bucket_rows)):
        if not ids:
            continue
        if where and predicate is not where:
            predicate = f"({predicate}) AND ({where})"
        scanner = ds.scanner(
            fragments=[ds.get_fragment(i) for i in ids], columns=columns, filter=predicate
        )
        parts.append(scanner.to_table())
    return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


def _write_bucket(
    k: int,
    make: Callable[[int], pa.Table],
    uri: str,
    schema: pa.Schema,
    fragment_rows: int,
    opts: dict[str, str],
) -> tuple[int, list[bytes], int]:
    table = make(k)
    if not table.num_rows:
        return k, [], 0
    fragments = write_fragments(
        table.select(schema.names).cast(schema),
        uri,
        schema=schema,
        max_rows_per_file=fragment_rows,
        enable_stable_row_ids=True,
        storage_options=opts,
    )
    return k, [pickle.dumps(f) for f in fragments], table.num_rows


def write_bucketed_table(
    num_buckets: int,
    make: Callable[[int], pa.Table],
    uri: str,
    schema: pa.Schema,
    *,
    key: str,
    fragment_rows: int,
    storage: Storage,
    cpus: float,
) -> tuple[BucketLayout, int]:
    """Create the Lance table at `uri` from `make(k)` for every bucket, one Ray task each, in one
    commit (stable row ids, so the refresh can ask what changed). Returns the layout and rows.

    Each task writes its bucket's fragments; only their metadata comes back to be committed, so
    a failed task publishes nothing (the files of the others are unreferenced until then)."""
    opts = storage.lance_options()
    task = ray.remote(num_cpus=cpus)(_write_bucket)
    results = ray.get(
        [task.remote(k, make, uri, schema, fragment_rows, opts) for k in range(num_buckets)]
    )
    fragments, files, rows = [], {}, 0
    for k, written, n in sorted(results):
        rows += n
        for blob in written:
            fragment = pickle.loads(blob)
            fragments.append(fragment)
            files[fragment.data_files()[0].path] = k
    lance.LanceDataset.commit(
        uri,
        lance.LanceOperation.Overwrite(schema, fragments),
        storage_options=opts,
        enable_stable_row_ids=True,
    )
    return BucketLayout(key, num_buckets, files), rows


def _all_rows(k: int, *, p: BucketPlan, storage: Storage, columns: list[str]) -> pa.Table:
    return read_bucket(p, storage, k, columns)


def rewrite(p: BucketPlan, storage: Storage, *, fragment_rows: int, cpus: float) -> BucketLayout:
    """The table at `p`'s version rewritten as one-bucket fragments, as a new version (new row
    ids: a refresh asks what changed only within a step, never across this rewrite)."""
    ds = storage.open_lance(p.uri, p.version)
    found, _ = write_bucketed_table(
        p.layout.num_buckets,
        partial(_all_rows, p=p, storage=storage, columns=ds.schema.names),
        p.uri,
        ds.schema,
        key=p.layout.key,
        fragment_rows=fragment_rows,
        storage=storage,
        cpus=cpus,
    )
    return found
