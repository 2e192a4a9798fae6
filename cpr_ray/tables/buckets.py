"""Key-bucketed tables and the one fan-out over their buckets: the shape big joins take so that
they need no shuffle.

Measured here (reference PERF_NOTES): a Ray Data hash-shuffle join of 1M papers × 5M citations
was 82× slower than one DuckDB query, while Ray tasks joining co-partitioned buckets with DuckDB
inside were within 3.2×. So every per-bucket step is `run_buckets`: one plain Ray task per bucket
(resources from config); a task that re-buckets its rows writes them straight into the bucket
folders of its output (`write_partitions`), never through the object store.

Two kinds of bucketed table:

- **Staging tables** (Parquet, `_bucket=k/` folders): each side of a join, written once
  partitioned by `hash(key) % n`. Two extra partitions hold what a parser set aside:
  `_bucket=-1` quarantined lines, `_bucket=-2` valid rows dropped by rule, so both are counted
  from file footers without another pass. `read_parquet_bucket` reads one bucket.
- **The corpus tables** (Lance): ingest writes every bucket's rows as fragments of their own —
  papers by `corpus_id % n`, citations by `citing_id % n` — and records in its manifest which
  fragment holds which bucket (`BucketLayout`, keyed by the fragment's first data file), so
  mining reads bucket k in place with no per-build snapshot. `read_lance_bucket` scans exactly
  bucket k's fragments at the version its `BucketPlan` names, with projection and predicates
  pushed into Lance. The nightly refresh edits each bucket's fragments in that bucket's task
  and writes its new rows as fragments of that bucket, recorded too (`corpus.bucket_edits`).
  Refreshes of earlier versions appended fragments that mix buckets; those are not in the
  record, so every bucket's reader scans them too with the bucket predicate pushed down — the
  record is never wrong, only incomplete, and `rewrite` makes it complete again. `plan` reports
  how many rows are read that way.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import lance
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import ray
from lance.fragment import LanceFragment, write_fragments

from cpr_ray.storage.store import Storage, join

BUCKET = "_bucket"
T = TypeVar("T")
REJECTED = -1
SKIPPED = -2


def bucket_uri(uri: str, bucket: int) -> str:
    return join(uri, f"{BUCKET}={bucket}")


def bucketed_dataset(storage: Storage, uri: str) -> pds.Dataset:
    """Every bucket folder of `uri` as one dataset with its `_bucket` column, so a filter on
    the bucket reads only the folders it names."""
    loc = storage.resolve(uri)
    return pds.dataset(
        loc.path,
        filesystem=loc.fs,
        format="parquet",
        partitioning="hive",
        ignore_prefixes=["."],  # the bucket folders themselves start with "_"
    )


def _dataset(storage: Storage, uri: str) -> pds.Dataset | None:
    loc = storage.resolve(uri)
    if storage.file_type(loc.uri) == pafs.FileType.NotFound:
        return None
    return pds.dataset(loc.path, filesystem=loc.fs, format="parquet", exclude_invalid_files=False)


def count_rows(storage: Storage, uri: str, bucket: int) -> int:
    """Rows in one partition, from Parquet footers only."""
    ds = _dataset(storage, bucket_uri(uri, bucket))
    return 0 if ds is None else ds.count_rows()


def count_split(storage: Storage, uri: str) -> dict[str, int]:
    """Rows kept, rejected and skipped in a bucketed table."""
    loc = storage.resolve(uri)
    kept = 0
    for info in loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True)):
        name = info.base_name
        if info.type == pafs.FileType.Directory and name.startswith(f"{BUCKET}="):
            bucket = int(name.split("=", 1)[1])
            if bucket >= 0:
                kept += count_rows(storage, uri, bucket)
    return {
        "kept": kept,
        "rejected": count_rows(storage, uri, REJECTED),
        "skipped": count_rows(storage, uri, SKIPPED),
    }


def read_parquet_bucket(storage: Storage, uri: str, bucket: int, schema: pa.Schema) -> pa.Table:
    """One bucket of one side, or an empty table of the right schema when it has no rows."""
    ds = _dataset(storage, bucket_uri(uri, bucket))
    if ds is None:
        return schema.empty_table()
    table = ds.to_table()
    return table.select(schema.names).cast(schema) if table.num_rows else schema.empty_table()


def iter_bucket(storage: Storage, uri: str, bucket: int, columns: list[str]) -> Iterator[pa.Table]:
    """One partition's rows file by file: memory bounded by one file, whatever it holds."""
    ds = _dataset(storage, bucket_uri(uri, bucket))
    for fragment in [] if ds is None else ds.get_fragments():
        yield fragment.to_table(columns=columns)


def write_partitions(table: pa.Table, uri: str, storage: Storage, part: str) -> None:
    """One task's rows (with a `_bucket` column) into every bucket folder of `uri` they fall in,
    as `_bucket=j/part-{part}-0.parquet`: a task's share of a re-bucketing, with no shuffle
    through the object store. A retried task overwrites its own files."""
    loc = storage.resolve(uri)
    pds.write_dataset(
        table,
        loc.path,
        filesystem=loc.fs,
        format="parquet",
        partitioning=pds.partitioning(pa.schema([(BUCKET, pa.int32())]), flavor="hive"),
        basename_template=f"part-{part}-{{i}}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        create_dir=not loc.is_s3,
    )


def _call(fn: Callable[[int], T], k: int) -> T:
    return fn(k)


def run_buckets(
    num_buckets: int, fn: Callable[[int], T], num_cpus: float, memory: int | None = None
) -> list[T]:
    """`fn(k)` for every bucket k, one Ray task each (`fn` shipped once), in bucket order;
    `memory`: the bytes each task asks Ray for."""
    memory_option: dict[str, Any] = {"memory": memory} if memory else {}
    # Any: Ray's remote-function types take an argument's type, not the ObjectRef passed for it
    task: Any = ray.remote(num_cpus=num_cpus, **memory_option)(_call)
    ref = ray.put(fn)
    return ray.get([task.remote(ref, k) for k in range(num_buckets)])


# -- the corpus tables: Lance, one set of fragments per bucket -----------------------------------


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


def planned_fragment(ds: lance.LanceDataset, fragment_id: int) -> LanceFragment:
    """A fragment a plan named, of the table version the plan was made at: one missing there
    means the plan and the version disagree, a bug said here rather than as None later."""
    found = ds.get_fragment(fragment_id)
    if found is None:
        raise ValueError(f"{ds.uri} at version {ds.version} has no fragment {fragment_id}")
    return found


def lance_schema(p: BucketPlan, storage: Storage, columns: list[str]) -> pa.Schema:
    ds = storage.open_lance(p.uri, p.version)
    return pa.schema([ds.schema.field(c) for c in columns])


def read_lance_bucket(
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
            fragments=[planned_fragment(ds, i) for i in ids], columns=columns, filter=predicate
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
    opts = storage.lance_options(uri)
    write = partial(
        _write_bucket, make=make, uri=uri, schema=schema, fragment_rows=fragment_rows, opts=opts
    )
    results = run_buckets(num_buckets, write, cpus)
    fragments, files, rows = [], {}, 0
    for k, written, n in sorted(results):
        rows += n
        for blob in written:
            fragment = pickle.loads(blob)
            fragments.append(fragment)
            files[fragment.data_files()[0].path] = k
    storage.commit_lance(
        uri,
        lambda: lance.LanceDataset.commit(
            uri,
            lance.LanceOperation.Overwrite(schema, fragments),
            storage_options=opts,
            enable_stable_row_ids=True,
        ),
    )
    return BucketLayout(key, num_buckets, files), rows


def _all_rows(k: int, *, p: BucketPlan, storage: Storage, columns: list[str]) -> pa.Table:
    return read_lance_bucket(p, storage, k, columns)


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
