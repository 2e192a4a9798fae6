"""Bulk shards parsed into key-bucketed rows: the parse steps over a batch of lines, one Ray task
per shard writing straight into bucket folders (a refresh's diff files: `release_step`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pafs

from cpr_ray import buckets
from cpr_ray.buckets import bucket_uri, run_buckets, write_partitions
from cpr_ray.config import Config
from cpr_ray.corpus import linking
from cpr_ray.corpus.inputs import InputSet
from cpr_ray.corpus.records import RecordSpec, parse_lines
from cpr_ray.corpus.shards import CORRUPT_SHARD, ReadShards
from cpr_ray.stage import StageRun
from cpr_ray.storage import Storage


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
    the rows straight into the bucket folders of `out` (`buckets.write_partitions`), so lines and
    rows never pass through the object store. Parsed rows are held until about one file per
    bucket is due. A retried task rewrites its own files (named by shard and part)."""

    files: tuple[str, ...]
    reader: ReadShards
    step: ParseRecords
    out: str
    batch_lines: int
    rows_per_file: int

    def __call__(self, k: int) -> None:
        parsed: list[pa.Table] = []
        n_parsed = part = 0
        flush_at = self.rows_per_file * (self.step.num_buckets + 2)
        for rows in parsed_batches(self.reader, self.files[k], self.step, self.batch_lines):
            parsed.append(rows)
            n_parsed += rows.num_rows
            if n_parsed >= flush_at:
                self._write(k, part, parsed)
                parsed, n_parsed, part = [], 0, part + 1
        if parsed:
            self._write(k, part, parsed)

    def _write(self, k: int, part: int, parsed: list[pa.Table]) -> None:
        name = f"{k:05d}-{part:04d}"  # a retried task rewrites its own files
        write_partitions(pa.concat_tables(parsed), self.out, self.reader.storage, name)


def parsed_batches(
    reader: ReadShards, uri: str, step: ParseRecords, batch_lines: int
) -> Iterator[pa.Table]:
    """One shard's lines parsed about `batch_lines` at a time (DuckDB pays per call, so a few
    large calls, and memory stays bounded by one batch)."""
    lines: list[pa.Table] = []
    n_lines = 0
    for table in reader(pa.table({"path": [uri]})):
        lines.append(table)
        n_lines += table.num_rows
        if n_lines >= batch_lines:
            yield step(pa.concat_tables(lines))
            lines, n_lines = [], 0
    if lines:
        yield step(pa.concat_tables(lines))


def parse_input(
    run: StageRun, item: InputSet, step: ParseRecords, out: str, quarantined: Mapping[str, str]
) -> None:
    reader = ReadShards(run.storage, run.cfg.ingest.on_corrupt_shard, dict(quarantined))
    batch = run.cfg.ingest.batch_size
    parse = ParseShard(item.files, reader, step, out, batch, rows_per_file(run.cfg))
    run_buckets(len(item.files), parse, run.cfg.ingest.cpus_per_task)


def rows_per_file(cfg: Config) -> int:
    return max(1000, cfg.ingest.batch_size)


def corrupt_shards(storage: Storage, uri: str) -> dict[str, str]:
    """Shard URI → where it broke, for the shards a parse pass found corrupt (quarantine mode)."""
    loc = storage.resolve(bucket_uri(uri, buckets.REJECTED))
    if loc.fs.get_file_info(loc.path).type == pafs.FileType.NotFound:
        return {}
    found = pds.dataset(loc.path, filesystem=loc.fs, format="parquet").to_table(
        columns=["path", "raw"], filter=pc.field("reject_reason") == CORRUPT_SHARD
    )
    return dict(zip(found["path"].to_pylist(), found["raw"].to_pylist()))


def rows_schema(schema: pa.Schema) -> pa.Schema:
    drop = {buckets.BUCKET, "reject_reason", "raw", "path"}
    return pa.schema([f for f in schema if f.name not in drop])
