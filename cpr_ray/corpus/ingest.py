"""The `ingest` stage: S2 bulk shards + an OpenAlex snapshot → `papers`, `citations`, `venues`.

Streaming Ray Data reads parse every shard into key-bucketed staging tables (bad lines
quarantined with their reason), then one Ray task per bucket links and assembles rows with DuckDB,
and the mutable corpus tables are written as Lance datasets with stable row ids so that the
nightly refresh can upsert into them and ask what changed. Nothing is collected on the driver
but counts and the small venue aggregates.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import lance
import lance_ray
import pyarrow as pa
import ray
from rich.table import Table

from cpr_ray import buckets, schemas
from cpr_ray.buckets import bucket_uri, map_buckets, read_bucket, write_bucketed
from cpr_ray.config import Config
from cpr_ray.corpus import linking, records
from cpr_ray.corpus.records import RecordSpec, parse_lines
from cpr_ray.corpus.s2orc import recover_contexts
from cpr_ray.errors import InputError
from cpr_ray.stage import StageOutput, StageRun, console, run_stage
from cpr_ray.storage import Storage, StorageError, join

STAGE = "ingest"
TEXT_SUFFIXES = (".gz", ".jsonl", ".json")


@dataclass(frozen=True)
class InputSet:
    """One bulk dataset: where it lives, its files, and whether a build can do without it."""

    name: str
    uri: str
    required: bool
    files: tuple[str, ...] = ()
    fingerprint: str = ""


def _input_sets(cfg: Config) -> list[InputSet]:
    s2, oa = cfg.input.s2, cfg.input.openalex
    return [
        InputSet("papers", join(s2, "papers"), True),
        InputSet("abstracts", join(s2, "abstracts"), False),
        InputSet("citations", join(s2, "citations"), True),
        InputSet("publication-venues", join(s2, "publication-venues"), False),
        InputSet("s2orc", join(s2, "s2orc"), False),
        InputSet("works", join(oa, "works"), True),
        InputSet("sources", join(oa, "sources"), False),
    ]


def discover_inputs(cfg: Config, storage: Storage) -> dict[str, InputSet]:
    """List every input shard once; fail early, naming the folder, when a required one is empty."""
    found: dict[str, InputSet] = {}
    for item in _input_sets(cfg):
        if not storage.exists(item.uri):
            if item.required:
                raise InputError(
                    f"required input {item.name!r} not found at {item.uri} "
                    f"(check input.s2 / input.openalex)"
                )
            console.print(f"  [yellow]note[/]: optional input {item.name!r} absent ({item.uri})")
            found[item.name] = item
            continue
        infos = storage.list_files(item.uri, TEXT_SUFFIXES)
        if not infos and item.required:
            raise InputError(
                f"no shards (*{', *'.join(TEXT_SUFFIXES)}) under {item.uri} for required input "
                f"{item.name!r}"
            )
        digest = hashlib.sha256()
        for info in infos:
            digest.update(f"{info.path}\0{info.size}\0{info.mtime_ns}\n".encode())
        found[item.name] = InputSet(
            item.name,
            item.uri,
            item.required,
            tuple(i.path for i in infos),
            digest.hexdigest()[:16],
        )
    return found


def snapshot_label(cfg: Config, works: InputSet) -> str:
    """Which OpenAlex snapshot the topics came from: config, else the newest partition date."""
    if cfg.input.openalex_snapshot:
        return cfg.input.openalex_snapshot
    dates = sorted(
        {m.group(1) for f in works.files for m in [re.search(r"updated_date=([\d-]+)", f)] if m}
    )
    return (
        f"openalex updated_date<={dates[-1]}" if dates else "unknown (set input.openalex_snapshot)"
    )


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


def _read_lines(storage: Storage, item: InputSet) -> ray.data.Dataset:
    fs = storage.resolve(item.uri).fs
    return ray.data.read_text(list(item.files), filesystem=fs, include_paths=True)


def _empty_lines() -> pa.Table:
    return pa.table({"text": pa.array([], pa.string()), "path": pa.array([], pa.string())})


def _run(run: StageRun, inputs: dict[str, InputSet]) -> StageOutput:
    cfg, storage = run.cfg, run.storage
    n = cfg.ingest.num_buckets
    cpus = cfg.ingest.cpus_per_task
    threads = max(1, int(cpus))  # DuckDB inside a task uses the CPUs the task reserved
    staging = join(run.out, "_staging")
    rows_per_file = max(1000, cfg.ingest.batch_size)

    def stage_uri(name: str) -> str:
        return join(staging, name)

    # 1. parse every shard into bucketed staging tables --------------------------------------
    empty_schema: dict[str, pa.Schema] = {}
    for name, item in inputs.items():
        step_cls = ParseWorks if name == "works" else ParseRecords
        step = step_cls(records.SPECS[name], n, cfg.ingest.raw_line_limit, threads)
        empty_schema[name] = step(_empty_lines()).schema
        if not item.files:
            continue
        console.print(f"  parsing {name}: {len(item.files)} shard(s) from {item.uri}")
        ds = _read_lines(storage, item).map_batches(
            step, batch_size=cfg.ingest.batch_size, batch_format="pyarrow", num_cpus=cpus
        )
        write_bucketed(ds, stage_uri(name), storage, rows_per_file)

    counts = {name: buckets.count_split(storage, stage_uri(name)) for name in inputs}
    rejects_uri = _collect_rejects(storage, staging, inputs, join(run.out, "rejects"))
    _check_reject_rates(cfg, counts, rejects_uri)

    # 2. S2 identifiers → key buckets; then match keys bucket by bucket ----------------------
    good_paper_dirs = [
        storage.resolve(bucket_uri(stage_uri("papers"), k)).path
        for k in range(n)
        if buckets.count_rows(storage, stage_uri("papers"), k)
    ]
    fs = storage.resolve(staging).fs
    s2_keys = ray.data.read_parquet(good_paper_dirs, filesystem=fs).select_columns(
        ["corpus_id", "doi", "mag_id", "pmid"]
    )
    write_bucketed(
        s2_keys.map_batches(linking.s2_keys, fn_kwargs={"num_buckets": n}, batch_format="pyarrow"),
        stage_uri("s2_keys"),
        storage,
        rows_per_file,
    )
    s2_keys_schema = _rows_schema(
        linking.s2_keys(_rows_schema(empty_schema["papers"]).empty_table(), n).schema
    )
    match = partial(
        _match_bucket,
        storage=storage,
        s2_uri=stage_uri("s2_keys"),
        s2_schema=s2_keys_schema,
        works_uri=stage_uri("works"),
        works_schema=_rows_schema(empty_schema["works"]),
        num_buckets=n,
        threads=threads,
    )
    write_bucketed(map_buckets(n, match, cpus), stage_uri("matches"), storage, rows_per_file)

    # 3. assemble papers and citations per corpus-id bucket, into Lance ----------------------
    matches_schema = linking.match_keys(
        s2_keys_schema.empty_table(), match.keywords["works_schema"].empty_table(), n
    ).schema
    side = {
        "papers": (stage_uri("papers"), _rows_schema(empty_schema["papers"])),
        "abstracts": (stage_uri("abstracts"), _rows_schema(empty_schema["abstracts"])),
        "matches": (stage_uri("matches"), _rows_schema(matches_schema)),
        "citations": (stage_uri("citations"), _rows_schema(empty_schema["citations"])),
        "s2orc": (stage_uri("s2orc"), _rows_schema(empty_schema["s2orc"])),
    }
    papers_uri = join(run.out, "papers.lance")
    citations_uri = join(run.out, "citations.lance")
    lance_opts = storage.lance_options()
    for name, uri, bucket_fn, schema in (
        ("papers", papers_uri, _papers_bucket, schemas.PAPERS),
        ("citations", citations_uri, _citations_bucket, schemas.CITATIONS),
    ):
        console.print(f"  assembling {name}")
        ds = map_buckets(n, partial(bucket_fn, storage=storage, side=side, threads=threads), cpus)
        _write_corpus_table(ds, uri, schema, cfg.ingest.lance_fragment_rows, lance_opts)

    # 4. venues: small tables, joined once -----------------------------------------------------
    venues_uri = join(run.out, "venues.parquet")
    venues = _build_venues(storage, papers_uri, stage_uri, empty_schema, lance_opts)
    storage.write_parquet(venues, venues_uri)

    papers_tbl = lance.dataset(papers_uri, storage_options=lance_opts)
    n_papers = papers_tbl.count_rows()
    join_rate = {
        key: papers_tbl.count_rows(filter=f"join_key = '{key}'") for key in linking.KEY_PRIORITY
    }
    join_rate["none"] = n_papers - sum(join_rate.values())
    n_citations = lance.dataset(citations_uri, storage_options=lance_opts).count_rows()
    with_context = lance.dataset(citations_uri, storage_options=lance_opts).count_rows(
        filter="context_source IS NOT NULL"
    )
    storage.delete_dir(staging)

    stats = {
        "inputs": counts,
        "openalex_snapshot": snapshot_label(cfg, inputs["works"]),
        "papers": n_papers,
        "papers_with_abstract": papers_tbl.count_rows(filter="abstract IS NOT NULL"),
        "papers_with_topics": papers_tbl.count_rows(filter="field_id IS NOT NULL"),
        "join_by_key": join_rate,
        "join_rate": round((n_papers - join_rate["none"]) / n_papers, 4) if n_papers else 0.0,
        "citations": n_citations,
        "citations_with_context": with_context,
        "venues": venues.num_rows,
        "venues_linked_to_openalex": venues.num_rows - venues["openalex_source_id"].null_count,
        "rejects": sum(c["rejected"] for c in counts.values()),
    }
    _print_summary(stats)
    return StageOutput(
        tables={
            "papers": {"uri": papers_uri, "format": "lance", "rows": n_papers},
            "citations": {"uri": citations_uri, "format": "lance", "rows": n_citations},
            "venues": {"uri": venues_uri, "format": "parquet", "rows": venues.num_rows},
            "rejects": {"uri": rejects_uri, "format": "parquet", "rows": stats["rejects"]},
        },
        stats=stats,
    )


def _write_corpus_table(
    ds: ray.data.Dataset, uri: str, schema: pa.Schema, fragment_rows: int, opts: dict[str, str]
) -> None:
    """A mutable corpus table: Lance with stable row ids, so the nightly refresh can upsert
    into it and ask which rows changed (TABLES_NOTES); fragments sized for parallel scans."""
    lance_ray.write_lance(
        ds,
        uri,
        schema=schema,
        mode="create",
        enable_stable_row_ids=True,
        storage_options=opts,
        min_rows_per_file=fragment_rows,
        max_rows_per_file=fragment_rows,
    )


def _rows_schema(schema: pa.Schema) -> pa.Schema:
    drop = {buckets.BUCKET, "reject_reason", "raw", "path"}
    return pa.schema([f for f in schema if f.name not in drop])


def _match_bucket(
    k: int,
    *,
    storage: Storage,
    s2_uri: str,
    s2_schema: pa.Schema,
    works_uri: str,
    works_schema: pa.Schema,
    num_buckets: int,
    threads: int,
) -> pa.Table:
    s2 = read_bucket(storage, s2_uri, k, s2_schema)
    works = read_bucket(storage, works_uri, k, works_schema)
    return linking.match_keys(s2, works, num_buckets, threads)


def _side(storage: Storage, side: dict[str, tuple[str, pa.Schema]], name: str, k: int) -> pa.Table:
    uri, schema = side[name]
    return read_bucket(storage, uri, k, schema)


def _papers_bucket(
    k: int, *, storage: Storage, side: dict[str, tuple[str, pa.Schema]], threads: int
) -> pa.Table:
    return linking.assemble_papers(
        _side(storage, side, "papers", k),
        _side(storage, side, "abstracts", k),
        _side(storage, side, "matches", k),
        threads,
    )


def _citations_bucket(
    k: int, *, storage: Storage, side: dict[str, tuple[str, pa.Schema]], threads: int
) -> pa.Table:
    # s2orc documents are bucketed by their corpus id, which is the citing id here
    recovered = recover_contexts(_side(storage, side, "s2orc", k))
    return linking.assemble_citations(_side(storage, side, "citations", k), recovered, threads)


def _build_venues(
    storage: Storage,
    papers_uri: str,
    stage_uri: Any,
    empty_schema: dict[str, pa.Schema],
    lance_opts: dict[str, str],
) -> pa.Table:
    counts = (
        ray.data.read_lance(
            papers_uri, columns=["venue_id", "field_id"], storage_options=lance_opts
        )
        .groupby(["venue_id", "field_id"], num_partitions=4)
        .count()
    )
    refs = counts.to_arrow_refs()
    tables = [t for t in ray.get(refs) if t.num_rows]
    field_counts = (
        pa.concat_tables(tables).rename_columns(["venue_id", "field_id", "n"])
        if tables
        else pa.table(
            {
                "venue_id": pa.array([], pa.string()),
                "field_id": pa.array([], pa.int32()),
                "n": pa.array([], pa.int64()),
            }
        )
    )
    venues = _read_small(
        storage, stage_uri("publication-venues"), empty_schema["publication-venues"]
    )
    sources = _read_small(storage, stage_uri("sources"), empty_schema["sources"])
    return linking.assemble_venues(venues, sources, field_counts)


def _read_small(storage: Storage, uri: str, schema: pa.Schema) -> pa.Table:
    """The venue and source lists are small (~10^5 rows): one bucket holds all of them."""
    return read_bucket(storage, uri, 0, _rows_schema(schema))


def _collect_rejects(storage: Storage, staging: str, inputs: dict[str, InputSet], out: str) -> str:
    """Quarantined lines of every input, in one table with their dataset, file and reason."""
    parts = []
    for name in inputs:
        uri = bucket_uri(join(staging, name), buckets.REJECTED)
        if buckets.count_rows(storage, join(staging, name), buckets.REJECTED):
            loc = storage.resolve(uri)
            parts.append(
                ray.data.read_parquet(loc.path, filesystem=loc.fs)
                .select_columns(["path", "reject_reason", "raw"])
                .map_batches(_label_rejects, fn_kwargs={"dataset": name}, batch_format="pyarrow")
            )
    if parts:
        loc = storage.resolve(out)
        ds = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
        ds.write_parquet(loc.path, filesystem=loc.fs, try_create_dir=not loc.is_s3)
    return out


def _label_rejects(batch: pa.Table, dataset: str) -> pa.Table:
    return pa.table(
        {
            "dataset": pa.array([dataset] * batch.num_rows, pa.string()),
            "path": batch["path"],
            "reason": batch["reject_reason"],
            "raw": batch["raw"],
        },
        schema=schemas.REJECTS,
    )


def _check_reject_rates(cfg: Config, counts: dict[str, dict[str, int]], rejects_uri: str) -> None:
    limit = cfg.ingest.max_reject_rate
    for name, c in counts.items():
        total = c["kept"] + c["rejected"] + c["skipped"]
        if total and c["rejected"] / total > limit:
            raise InputError(
                f"{c['rejected']:,} of {total:,} lines of {name!r} were rejected "
                f"({c['rejected'] / total:.1%} > ingest.max_reject_rate={limit:.1%}); is the input "
                f"the right dataset and format? The rejected lines and reasons are in {rejects_uri}"
            )


def _print_summary(stats: dict[str, Any]) -> None:
    table = Table(title="ingest: lines by input", title_justify="left")
    for col in ("input", "kept", "rejected", "skipped by rule"):
        table.add_column(col, justify="right" if col != "input" else "left")
    for name, c in stats["inputs"].items():
        table.add_row(name, f"{c['kept']:,}", f"{c['rejected']:,}", f"{c['skipped']:,}")
    console.print(table)
    keys = ", ".join(f"{k} {v:,}" for k, v in stats["join_by_key"].items())
    console.print(
        f"  papers {stats['papers']:,} (abstract {stats['papers_with_abstract']:,}, topics "
        f"{stats['papers_with_topics']:,}); linked to OpenAlex {stats['join_rate']:.1%} by key: "
        f"{keys}\n  citations {stats['citations']:,} ({stats['citations_with_context']:,} with a "
        f"citing sentence); venues {stats['venues']:,} "
        f"({stats['venues_linked_to_openalex']:,} linked to an OpenAlex source); "
        f"rejects {stats['rejects']:,}; topics from {stats['openalex_snapshot']}"
    )


def ingest(cfg: Config, storage: Storage, *, force: bool = False) -> dict[str, Any]:
    """Run (or skip) the ingest stage and return its manifest."""
    try:
        storage.check(storage.root)
    except StorageError as exc:
        raise InputError(f"storage.root is not usable: {exc}") from None
    inputs = discover_inputs(cfg, storage)
    fingerprints = {name: item.fingerprint for name, item in inputs.items()}
    return run_stage(
        STAGE,
        cfg,
        storage,
        inputs=fingerprints,
        config_sections=("input", "ingest"),
        fn=partial(_run, inputs=inputs),
        force=force,
    )


__all__: Sequence[str] = ("ingest", "InputError", "discover_inputs", "ParseRecords", "ParseWorks")
