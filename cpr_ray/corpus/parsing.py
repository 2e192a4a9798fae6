"""Bulk shards parsed into key-bucketed rows: the parse steps over a batch of lines, one Ray task
per shard writing straight into bucket folders (a refresh's diff files: `release_step`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pafs

from cpr_ray.corpus import linking
from cpr_ray.corpus.inputs import InputSet
from cpr_ray.corpus.parse_buffer import MIB, BucketBuffer, line_batch_bytes, parse_task_memory
from cpr_ray.corpus.records import RecordSpec, parse_lines
from cpr_ray.corpus.shards import CORRUPT_SHARD, ReadShards
from cpr_ray.runs.stage_runner import StageRun
from cpr_ray.storage.store import Storage
from cpr_ray.tables import buckets
from cpr_ray.tables.buckets import bucket_uri, run_buckets


@dataclass(frozen=True)
class ParseRecords:
    """Step: raw lines → typed rows with a `_bucket` column (see `records`)."""

    spec: RecordSpec
    num_buckets: int
    raw_limit: int
    threads: int = 1

    def __call__(self, lines: pa.Table) -> pa.Table:
        return parse_lines(lines, self.spec, self.num_buckets, self.raw_limit, self.threads)


@dataclass(frozen=True)
class ParseWorks(ParseRecords):
    """Step: OpenAlex work lines → key rows with payload, bucketed by key hash."""

    def __call__(self, lines: pa.Table) -> pa.Table:
        return linking.work_keys(super().__call__(lines), self.num_buckets, self.threads)


@dataclass(frozen=True)
class ParseShard:
    """One Ray task per shard: stream its lines, parse them in batches with DuckDB, and write
    the rows straight into the bucket folders of `out`, so lines and rows never pass through the
    object store. Parsed rows are held until they reach `buffer_bytes` (`corpus.parse_buffer`),
    so the task's memory is bounded by that, not by its shard. A retried task rewrites its own
    files (named by shard and part)."""

    files: tuple[str, ...]
    reader: ReadShards
    step: ParseRecords
    out: str
    batch_lines: int
    buffer_bytes: int

    def __call__(self, k: int) -> None:
        buffer, part = BucketBuffer(), 0
        batches = parsed_batches(
            self.reader, self.files[k], self.step, self.batch_lines, self.buffer_bytes
        )
        for rows in batches:
            buffer.add(rows)
            del rows  # the buffer holds it sorted: not twice while the next batch parses
            if buffer.nbytes >= self.buffer_bytes:
                buffer.flush(self.reader.storage, self.out, f"{k:05d}-{part:04d}")
                part += 1
        buffer.flush(self.reader.storage, self.out, f"{k:05d}-{part:04d}")


def parsed_batches(
    reader: ReadShards, uri: str, step: ParseRecords, batch_lines: int, buffer_bytes: int = 0
) -> Iterator[pa.Table]:
    """One shard's lines parsed about `batch_lines` at a time, or, for a parse buffer of
    `buffer_bytes`, fewer (`line_batch_bytes`): DuckDB pays per call, so a few large calls, and
    memory stays bounded by one batch."""
    lines: list[pa.Table] = []
    n_lines = n_bytes = 0
    for table in reader(pa.table({"path": [uri]})):
        lines.append(table)
        n_lines += table.num_rows
        n_bytes += table.get_total_buffer_size()
        full = buffer_bytes and n_bytes >= line_batch_bytes(buffer_bytes, n_bytes / max(n_lines, 1))
        if n_lines >= batch_lines or full:
            batch, lines, n_lines, n_bytes = pa.concat_tables(lines), [], 0, 0
            yield step(batch)
    if lines:
        yield step(pa.concat_tables(lines))


def parse_input(
    run: StageRun, item: InputSet, step: ParseRecords, out: str, quarantined: Mapping[str, str]
) -> None:
    reader = ReadShards(run.storage, run.cfg.ingest.on_corrupt_shard, dict(quarantined))
    ingest = run.cfg.ingest
    buffer_bytes = ingest.parse_buffer_mb * MIB
    parse = ParseShard(item.files, reader, step, out, ingest.batch_size, buffer_bytes)
    run_buckets(
        len(item.files), parse, ingest.cpus_per_task, memory=parse_task_memory(buffer_bytes)
    )


def corrupt_shards(storage: Storage, uri: str) -> dict[str, str]:
    """Shard URI → where it broke, for the shards a parse pass found corrupt (quarantine mode)."""
    loc = storage.resolve(bucket_uri(uri, buckets.REJECTED))
    if storage.file_type(loc.uri) == pafs.FileType.NotFound:
        return {}
    found = pds.dataset(loc.path, filesystem=loc.fs, format="parquet").to_table(
        columns=["path", "raw"], filter=pc.field("reject_reason") == CORRUPT_SHARD
    )
    return dict(zip(found["path"].to_pylist(), found["raw"].to_pylist()))


def rows_schema(schema: pa.Schema) -> pa.Schema:
    drop = {buckets.BUCKET, "reject_reason", "raw", "path"}
    return pa.schema([f for f in schema if f.name not in drop])
