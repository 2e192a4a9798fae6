"""What one parse task holds, bounded by `ingest.parse_buffer_mb` whatever its shard, and the
memory it declares to Ray for that.

A parse task used to hold its rows until `rows_per_file × (num_buckets + 2)` of them were due:
12.9M rows with the cluster profile's settings, a whole abstracts shard (~15 GB in Arrow at
~1.2 kB an abstract) in each of 16 tasks per node, none of it declared. Now:

- its parsed rows wait in a `BucketBuffer`, sorted into their key buckets as they come, and
  are written — one Parquet file per bucket they fall in — as soon as they hold the budget in
  bytes. A shard of S parsed bytes so gives (num_buckets + 2) × ceil(S / budget) files of about
  budget / (num_buckets + 2) bytes each (the two extra partitions hold rejected and skipped
  lines); the config refuses a budget under 1 MiB per bucket file (`IngestConfig`);
- a batch of lines handed to DuckDB is cut at `line_batch_bytes` (1/8 of the budget, 1/32 for
  long lines) as well as at `ingest.batch_size` lines: DuckDB's working memory for one call is up
  to ~20× its text when lines are long (it works 2,048 rows at a time: 4 MB of 16 kB abstracts
  took 85 MB), so a batch counted in lines alone grew with the lines (S2ORC documents are ~60 kB
  each). A cut at 1/32 for all lines cost 15% more parse CPU in 2–5× the DuckDB calls.

`parse_task_memory` is what the task asks Ray for: the process, plus `working_memory` (a fixed
part and twice the budget), measured. A Ray worker with the parser imported holds 262 MB; a
parse of 40 MB of 16 kB abstracts at an 8 MiB budget, in a process of its own, peaked 150-180 MB
above its idle process, where the old rule's peaked 566 MB above;
`tests/corpus/test_ingest_memory.py` parses a shard of 1 kB abstracts larger than
`working_memory` (381 MB: 142 MB above idle), where holding its rows peaked 494 MiB above and
parsing it in one DuckDB call 1.5 GiB.
So a node runs only as many parse tasks as its memory holds, and each holds what it declared.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.storage.store import Storage, join
from cpr_ray.tables.buckets import BUCKET, bucket_uri

MIB = 1 << 20
# DuckDB works 2,048 rows at a time, at up to ~20× their text (measured with 16 kB lines), and a
# batch is held about three times over (its lines, DuckDB's input and its rows): so a batch of
# lines is cut at budget / 8 while 2,048 of them take at most half the budget in DuckDB, and at
# budget / 32 when they are longer (S2ORC documents, ~60 kB each)
DUCKDB_VECTOR_ROWS = 2048
DUCKDB_AMPLIFICATION = 20
SHORT_LINES_SHARE, LONG_LINES_SHARE = 8, 32
# ... but not below this, or DuckDB's cost per call (a connection and its macros: ~10 ms, and
# ~100 ms on a loaded machine) would outweigh the parsing
MIN_LINE_BATCH = 4 * MIB
# a Ray worker with the parser imported (262 MB measured)
PROCESS_BYTES = 320 * MIB
# above the process and the buffer: one batch of MIN_LINE_BATCH through DuckDB, the writer
# threads, and what the allocators keep between batches (150-180 MB measured with long lines)
FIXED_BYTES = 256 * MIB
# peak RSS per byte of budget: the buffer itself (1), a batch of lines through DuckDB (at most
# 3/8 + 1/2 for short lines, 3/32 + 20/32 for long ones), and the bucket files being encoded
WORKING_FACTOR = 2.0
# bucket files written at once: an object store's upload latency, not bandwidth, bounds them
# (each writer thread also keeps allocator arenas: a few MB each)
WRITE_THREADS = 4


def line_batch_bytes(buffer_bytes: int, line_bytes: float) -> int:
    """Bytes of lines handed to the parser at once, for a buffer of `buffer_bytes` and lines of
    `line_bytes` on average."""
    vector = DUCKDB_VECTOR_ROWS * DUCKDB_AMPLIFICATION * line_bytes
    share = SHORT_LINES_SHARE if vector <= buffer_bytes / 2 else LONG_LINES_SHARE
    return max(MIN_LINE_BATCH, buffer_bytes // share)


def working_memory(buffer_bytes: int) -> int:
    """Bytes a parse task's peak RSS may grow above its idle process, for a buffer of
    `buffer_bytes`: what `tests/corpus/test_ingest_memory.py` holds a parse to."""
    return FIXED_BYTES + int(WORKING_FACTOR * buffer_bytes)


def parse_task_memory(buffer_bytes: int) -> int:
    """Bytes of memory a parse task declares to Ray for a buffer of `buffer_bytes`."""
    return PROCESS_BYTES + working_memory(buffer_bytes)


class BucketBuffer:
    """Parsed rows (with a `_bucket` column) held by bucket until written.

    Each batch is sorted by bucket once as it comes (a stable sort: rows keep their order within
    a bucket) and kept as that one table with the slice each bucket owns, so a flush writes a
    bucket's file from slices of the batches (no copy of the whole buffer), and `nbytes` counts
    what the batches hold.
    """

    def __init__(self) -> None:
        self._batches: list[tuple[pa.Table, dict[int, tuple[int, int]]]] = []
        self.nbytes = 0

    def add(self, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        rows = rows.take(pc.sort_indices(rows[BUCKET]))
        runs = pc.value_counts(rows[BUCKET]).to_pylist()  # in sorted order: first seen first
        slices, offset = {}, 0
        for run in runs:
            slices[run["values"]] = (offset, run["counts"])
            offset += run["counts"]
        self._batches.append((rows, slices))
        self.nbytes += rows.get_total_buffer_size()

    def flush(self, storage: Storage, out: str, part: str) -> None:
        """Every bucket held into `out/_bucket=j/part-{part}-0.parquet` (the name a retried
        task rewrites), then nothing is held."""
        buckets = sorted({j for _, slices in self._batches for j in slices})
        with ThreadPoolExecutor(min(WRITE_THREADS, len(buckets) or 1)) as pool:
            list(pool.map(lambda j: self._write(storage, out, part, j), buckets))
        self._batches, self.nbytes = [], 0

    def _write(self, storage: Storage, out: str, part: str, bucket: int) -> None:
        rows = pa.concat_tables(
            table.slice(*slices[bucket]) for table, slices in self._batches if bucket in slices
        )
        uri = join(bucket_uri(out, bucket), f"part-{part}-0.parquet")
        storage.write_parquet(rows.drop_columns([BUCKET]), uri)
