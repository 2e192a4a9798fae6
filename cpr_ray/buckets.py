"""Key-bucketed tables: the shape big joins take so that they need no shuffle.

Measured here (reference PERF_NOTES): a Ray Data hash-shuffle join of 1M papers × 5M citations
was 82× slower than one DuckDB query, while Ray tasks joining co-partitioned buckets with DuckDB
inside were within 3.2×. So each side of a join is written once as Parquet partitioned by
`hash(key) % n` (`_bucket=k/` folders), and bucket k of every side is joined by one task.
Two extra partitions hold what a parser set aside: `_bucket=-1` quarantined lines, `_bucket=-2`
valid rows dropped by rule, so both are counted from file footers without another pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import ray

from cpr_ray.storage import Storage, join

BUCKET = "_bucket"
T = TypeVar("T")
REJECTED = -1
SKIPPED = -2


def bucket_uri(uri: str, bucket: int) -> str:
    return join(uri, f"{BUCKET}={bucket}")


def write_bucketed(
    ds: ray.data.Dataset, uri: str, storage: Storage, min_rows_per_file: int
) -> None:
    """Write `ds` (which carries a `_bucket` column) as a bucketed table under `uri`."""
    loc = storage.resolve(uri)
    ds.write_parquet(
        loc.path,
        filesystem=loc.fs,
        partition_cols=[BUCKET],
        min_rows_per_file=min_rows_per_file,
        try_create_dir=not loc.is_s3,
    )


def _dataset(storage: Storage, uri: str) -> pds.Dataset | None:
    loc = storage.resolve(uri)
    if loc.fs.get_file_info(loc.path).type == pafs.FileType.NotFound:
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


def read_bucket(storage: Storage, uri: str, bucket: int, schema: pa.Schema) -> pa.Table:
    """One bucket of one side, or an empty table of the right schema when it has no rows."""
    ds = _dataset(storage, bucket_uri(uri, bucket))
    if ds is None:
        return schema.empty_table()
    table = ds.to_table()
    return table.select(schema.names).cast(schema) if table.num_rows else schema.empty_table()


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


def run_buckets(num_buckets: int, fn: Callable[[int], T], num_cpus: float) -> list[T]:
    """`fn(k)` for every bucket k, one Ray task each (`fn` shipped once), in bucket order."""
    task = ray.remote(num_cpus=num_cpus)(_call)
    ref = ray.put(fn)
    return ray.get([task.remote(ref, k) for k in range(num_buckets)])


def _run(batch: pa.Table, fn: Callable[[int], pa.Table]) -> pa.Table:
    return pa.concat_tables([fn(int(b)) for b in batch["id"].to_pylist()])


def map_buckets(
    num_buckets: int, fn: Callable[[int], pa.Table], num_cpus: float
) -> ray.data.Dataset:
    """A dataset whose blocks are `fn(k)` for every bucket k, one Ray task per bucket."""
    return ray.data.range(num_buckets, override_num_blocks=num_buckets).map_batches(
        _run,
        fn_kwargs={"fn": fn},
        batch_size=1,
        batch_format="pyarrow",
        num_cpus=num_cpus,
    )
