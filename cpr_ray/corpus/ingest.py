"""The `ingest` stage: S2 bulk shards + an OpenAlex snapshot → `papers`, `citations`, `venues`.

Streaming Ray Data reads parse every shard into key-bucketed staging tables (bad lines
quarantined with their reason), then one Ray task per bucket links and assembles rows with DuckDB,
and the mutable corpus tables are written as Lance datasets with stable row ids so that the
nightly refresh can upsert into them and ask what changed. Nothing is collected on the driver
but counts and the small venue aggregates.

A shard that cannot be read to its end fails the stage before anything is published, naming it
and where it broke, or — with `ingest.on_corrupt_shard: quarantine` — is listed in the rejects
table and left out: its dataset is parsed once more without it, so none of its lines are used
and every intact shard's are. Empty (zero-byte) shards are skipped and counted; a required input
with no records at all is an error that names it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from cpr_ray.config import Config
from cpr_ray.corpus import linking, paper_keys, records
from cpr_ray.corpus.inputs import InputSet, discover_inputs, snapshot_label
from cpr_ray.corpus.parsing import (
    ParseRecords,
    ParseWorks,
    corrupt_shards,
    parse_input,
    rows_schema,
)
from cpr_ray.corpus.s2orc import recover_contexts
from cpr_ray.corpus.shards import LINES
from cpr_ray.errors import InputError
from cpr_ray.runs.stage_runner import (
    Phases,
    Reads,
    StageOutput,
    StageRun,
    console,
    entry,
    read_manifest,
)
from cpr_ray.stages import INGEST
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import buckets, schemas
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import (
    BucketPlan,
    bucket_uri,
    read_lance_bucket,
    read_parquet_bucket,
    run_buckets,
    write_bucketed_table,
    write_partitions,
)
from cpr_ray.tables.buckets import plan as plan_buckets

# parsed inputs kept beside the corpus tables (not in the staging folder a run removes): the
# refresh links new papers to OpenAlex through the key table and recounts venues from the lists
KEPT_INPUTS = {
    "works": "openalex_keys",
    "publication-venues": "s2_venues",
    "sources": "openalex_sources",
}


FIELD_COUNTS_TABLE = "venue_field_counts"


def run_ingest(run: StageRun, reads: Reads, inputs: dict[str, InputSet]) -> StageOutput:
    """Ingest as a list of named phases (their seconds go to the stats)."""
    job, phase = _Ingest(run, inputs), Phases()
    job.parse()
    phase.lap("parse")
    job.check_rejects()
    phase.lap("rejects")
    job.count_duplicates()
    phase.lap("duplicates")
    job.link()
    phase.lap("link")
    job.assemble()
    phase.lap("assemble")
    job.key_table()
    phase.lap("keys")
    job.build_venues()
    phase.lap("venues")
    corpus = job.corpus_counts()
    phase.lap("counts")
    return job.output(corpus, phase.seconds)


class _Ingest:
    """One ingest run: the staging tables its phases hand each other, and their counts."""

    def __init__(self, run: StageRun, inputs: dict[str, InputSet]) -> None:
        self.run, self.inputs = run, inputs
        self.cfg, self.storage = run.cfg, run.storage
        self.n = self.cfg.ingest.num_buckets
        self.cpus = self.cfg.ingest.cpus_per_task
        self.threads = max(1, int(self.cpus))  # DuckDB in a task uses the CPUs it reserved
        self.staging = join(run.out, "_staging")
        self.papers_uri = join(run.out, "papers.lance")
        self.citations_uri = join(run.out, "citations.lance")
        self.keys_uri = join(run.out, f"{paper_keys.TABLE}.lance")
        self.venues_uri = join(run.out, "venues.parquet")
        self.field_counts_uri = join(run.out, "venue-field-counts.parquet")
        self.field_counts_rows = 0
        self.empty_schema: dict[str, pa.Schema] = {}
        self.quarantined: dict[str, dict[str, str]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.rejects_uri = join(run.out, "rejects")
        self.layouts: dict[str, Any] = {}
        self.venues: pa.Table | None = None

    def stage_uri(self, name: str) -> str:
        if name in KEPT_INPUTS:
            return join(self.run.out, KEPT_INPUTS[name])
        return join(self.staging, name)

    def rows_schema(self, name: str) -> pa.Schema:
        return rows_schema(self.empty_schema[name])

    def parse(self) -> None:
        """Every shard into bucketed staging tables (a corrupt one quarantined by config)."""
        cfg, storage = self.cfg, self.storage
        for name, item in self.inputs.items():
            step_cls = ParseWorks if name == "works" else ParseRecords
            step = step_cls(records.SPECS[name], self.n, cfg.ingest.raw_line_limit, self.threads)
            self.empty_schema[name] = step(LINES.empty_table()).schema
            if not item.files:
                continue
            console.print(f"  parsing {name}: {len(item.files)} shard(s) from {item.uri}")
            parse_input(self.run, item, step, self.stage_uri(name), {})
            if cfg.ingest.on_corrupt_shard == "fail":
                continue  # a corrupt shard has failed the stage already
            self.quarantined[name] = corrupt_shards(storage, self.stage_uri(name))
            if self.quarantined[name]:
                console.print(
                    f"  [yellow]quarantined[/] {len(self.quarantined[name])} corrupt shard(s) "
                    f"of {name} (listed in the rejects table); parsing it again without them"
                )
                storage.delete_dir(self.stage_uri(name))
                parse_input(self.run, item, step, self.stage_uri(name), self.quarantined[name])

    def check_rejects(self) -> None:
        """Rejected lines into one table, and the reject-rate and empty-input checks."""
        storage, inputs = self.storage, self.inputs
        counts = {name: buckets.count_split(storage, self.stage_uri(name)) for name in inputs}
        _collect_rejects(storage, self.stage_uri, inputs, self.rejects_uri, self.cpus)
        _check_reject_rates(self.cfg, counts, self.rejects_uri)
        _check_not_empty(inputs, counts, self.rejects_uri)
        self.counts = counts

    def count_duplicates(self) -> None:
        """The duplicates the newest-first rule will drop, counted per input."""
        counts = self.counts
        dups = _count_duplicates(self.storage, self.stage_uri, self.n, self.cpus, self.threads)
        for name, item in self.inputs.items():
            counts[name] |= {
                "duplicates": dups.get(name, 0),
                "shards": len(item.files) + len(item.empty),
                "empty_shards": len(item.empty),
                "quarantined_shards": len(self.quarantined.get(name, {})),
            }
        self.counts = counts

    def link(self) -> None:
        """S2 identifiers → key buckets; then bucket k of the keys meets bucket k of the works.

        Each task re-buckets one bucket of papers by their identifiers' keys, written straight
        into the key buckets (no shuffle)."""
        storage, n = self.storage, self.n
        run_buckets(
            n,
            partial(
                _s2_keys_bucket,
                storage=storage,
                papers_uri=self.stage_uri("papers"),
                papers_schema=self.rows_schema("papers"),
                out=self.stage_uri("s2_keys"),
                num_buckets=n,
            ),
            self.cpus,
        )
        match = partial(
            _match_bucket,
            storage=storage,
            s2_uri=self.stage_uri("s2_keys"),
            s2_schema=self.s2_keys_schema(),
            works_uri=self.stage_uri("works"),
            works_schema=self.rows_schema("works"),
            out=self.stage_uri("matches"),
            num_buckets=n,
            threads=self.threads,
        )
        run_buckets(n, match, self.cpus)

    def s2_keys_schema(self) -> pa.Schema:
        return rows_schema(linking.s2_keys(self.rows_schema("papers").empty_table(), self.n).schema)

    def assemble(self) -> None:
        """Papers and citations per corpus-id bucket, written as Lance fragments per bucket."""
        matches_schema = linking.match_keys(
            self.s2_keys_schema().empty_table(), self.rows_schema("works").empty_table(), self.n
        ).schema
        side = {
            name: (self.stage_uri(name), self.rows_schema(name))
            for name in ("papers", "abstracts", "citations", "s2orc")
        }
        side["matches"] = (self.stage_uri("matches"), rows_schema(matches_schema))
        for name, uri, bucket_fn, schema, key in (
            ("papers", self.papers_uri, _papers_bucket, schemas.PAPERS, "corpus_id"),
            # citations bucketed by the citing paper: mining joins a paper with what it cites
            ("citations", self.citations_uri, _citations_bucket, schemas.CITATIONS, "citing_id"),
        ):
            console.print(f"  assembling {name} into {self.n} bucket(s) of Lance fragments")
            self.layouts[name], _ = write_bucketed_table(
                self.n,
                partial(bucket_fn, storage=self.storage, side=side, threads=self.threads),
                uri,
                schema,
                key=key,
                fragment_rows=self.cfg.ingest.lance_fragment_rows,
                storage=self.storage,
                cpus=self.cpus,
            )

    def papers_plan(self) -> BucketPlan:
        """The papers table's key buckets at its written version, for the passes that read it
        back (the key table, the venues' counts)."""
        return plan_buckets(
            self.layouts["papers"],
            self.storage,
            self.papers_uri,
            self.storage.open_lance(self.papers_uri).version,
        )

    def key_table(self) -> None:
        """The papers' DOI, MAG and PubMed keys → corpus id (`paper_keys`), in the key buckets
        the OpenAlex key table uses: what a refresh looks a new partition's keys up in."""
        storage = self.storage
        papers = self.papers_plan()
        self.layouts[paper_keys.TABLE] = paper_keys.build(
            storage,
            papers,
            self.keys_uri,
            self.n,
            join(self.staging, paper_keys.TABLE),
            cpus=self.cpus,
            fragment_rows=self.cfg.ingest.lance_fragment_rows,
        )

    def build_venues(self) -> None:
        """Venues: small tables joined once, with papers per field counted per bucket."""
        storage = self.storage
        papers_plan = self.papers_plan()
        counts = count_fields(storage, papers_plan, self.cpus)
        storage.write_parquet(counts, self.field_counts_uri)
        self.venues = build_venues(
            storage, counts, self.stage_uri("publication-venues"), self.stage_uri("sources")
        )
        storage.write_parquet(self.venues, self.venues_uri)
        self.field_counts_rows = counts.num_rows

    def corpus_counts(self) -> dict[str, Any]:
        """What the corpus tables hold (and the staging tables go)."""
        storage = self.storage
        papers = storage.open_lance(self.papers_uri)
        citations = storage.open_lance(self.citations_uri)
        keys = storage.open_lance(self.keys_uri)
        n_papers = papers.count_rows()
        join_rate = {
            key: papers.count_rows(filter=f"join_key = '{key}'") for key in linking.KEY_PRIORITY
        }
        join_rate["none"] = n_papers - sum(join_rate.values())
        storage.delete_dir(self.staging)
        return {
            "papers": n_papers,
            "papers_version": papers.version,
            "papers_with_abstract": papers.count_rows(filter="abstract IS NOT NULL"),
            "papers_with_topics": papers.count_rows(filter="field_id IS NOT NULL"),
            "join_by_key": join_rate,
            "join_rate": round((n_papers - join_rate["none"]) / n_papers, 4) if n_papers else 0.0,
            "citations": citations.count_rows(),
            "citations_version": citations.version,
            "citations_with_context": citations.count_rows(filter="context_source IS NOT NULL"),
            "paper_keys": keys.count_rows(),
            "paper_keys_version": keys.version,
        }

    def output(self, corpus: dict[str, Any], phase_seconds: dict[str, float]) -> StageOutput:
        counts, venues = self.counts, self.venues
        assert venues is not None
        stats = {
            "inputs": counts,
            "openalex_snapshot": snapshot_label(self.cfg, self.inputs["works"]),
            **{k: v for k, v in corpus.items() if not k.endswith("_version")},
            "venues": venues.num_rows,
            "venues_linked_to_openalex": venues.num_rows - venues["openalex_source_id"].null_count,
            "rejects": sum(c["rejected"] for c in counts.values()),
            "duplicates": sum(c["duplicates"] for c in counts.values()),
            "quarantined_shards": [
                {"input": name, "shard": uri, "detail": detail}
                for name, shards in self.quarantined.items()
                for uri, detail in shards.items()
            ],
            "phase_seconds": phase_seconds,
        }
        _print_summary(stats)
        return StageOutput(
            tables={
                # the version is what readers check (`stage.require_manifest`) and a refresh
                # restores
                "papers": {
                    "uri": self.papers_uri,
                    "format": "lance",
                    "rows": corpus["papers"],
                    "version": corpus["papers_version"],
                    "layout": self.layouts["papers"].as_dict(),
                },
                "citations": {
                    "uri": self.citations_uri,
                    "format": "lance",
                    "rows": corpus["citations"],
                    "version": corpus["citations_version"],
                    "layout": self.layouts["citations"].as_dict(),
                },
                paper_keys.TABLE: {
                    "uri": self.keys_uri,
                    "format": "lance",
                    "rows": corpus["paper_keys"],
                    "version": corpus["paper_keys_version"],
                    "layout": self.layouts[paper_keys.TABLE].as_dict(),
                },
                "venues": {"uri": self.venues_uri, "format": "parquet", "rows": venues.num_rows},
                # papers per venue and field, which a refresh keeps instead of recounting
                FIELD_COUNTS_TABLE: {
                    "uri": self.field_counts_uri,
                    "format": "parquet",
                    "rows": self.field_counts_rows,
                },
                "rejects": {"uri": self.rejects_uri, "format": "parquet", "rows": stats["rejects"]},
                **{
                    table: {
                        "uri": self.stage_uri(name),
                        "format": "bucketed-parquet",
                        "rows": counts[name]["kept"],
                    }
                    for name, table in KEPT_INPUTS.items()
                },
            },
            stats=stats,
        )


def _s2_keys_bucket(
    k: int,
    *,
    storage: Storage,
    papers_uri: str,
    papers_schema: pa.Schema,
    out: str,
    num_buckets: int,
) -> None:
    """Bucket k of the papers' S2 identifiers, into the key buckets of `out`."""
    papers = read_parquet_bucket(storage, papers_uri, k, papers_schema)
    keys = linking.s2_keys(papers.select(["corpus_id", "doi", "mag_id", "pmid"]), num_buckets)
    if keys.num_rows:
        write_partitions(keys, out, storage, str(k))


def _match_bucket(
    k: int,
    *,
    storage: Storage,
    s2_uri: str,
    s2_schema: pa.Schema,
    works_uri: str,
    works_schema: pa.Schema,
    out: str,
    num_buckets: int,
    threads: int,
) -> None:
    """Bucket k of the S2 keys matched against bucket k of the works, into the corpus-id
    buckets of `out`."""
    s2 = read_parquet_bucket(storage, s2_uri, k, s2_schema)
    works = read_parquet_bucket(storage, works_uri, k, works_schema)
    matches = linking.match_keys(s2, works, num_buckets, threads)
    if matches.num_rows:
        write_partitions(matches, out, storage, str(k))


def _side(storage: Storage, side: dict[str, tuple[str, pa.Schema]], name: str, k: int) -> pa.Table:
    uri, schema = side[name]
    return read_parquet_bucket(storage, uri, k, schema)


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


def _venue_field_counts(k: int, *, papers: BucketPlan, storage: Storage) -> pa.Table:
    rows = read_lance_bucket(papers, storage, k, ["venue_id", "field_id"])
    return duck.query("SELECT venue_id, field_id, count(*) AS n FROM rows GROUP BY ALL", rows=rows)


FIELD_COUNTS = pa.schema([("venue_id", pa.string()), ("field_id", pa.int32()), ("n", pa.int64())])


def count_fields(storage: Storage, papers: BucketPlan, cpus: float = 1.0) -> pa.Table:
    """How many papers each venue has per field (`FIELD_COUNTS`), counted per key bucket of the
    papers table."""
    parts = run_buckets(
        papers.layout.num_buckets,
        partial(_venue_field_counts, papers=papers, storage=storage),
        cpus,
    )
    return add_field_counts(parts)


def add_field_counts(parts: Sequence[pa.Table]) -> pa.Table:
    """Per (venue, field) sums of counts (or of changes to them: `updates.field_count_delta`),
    a venue and field without a paper left out; a table of one exact order, so counts kept by
    adding each refresh step's changes equal a recount."""
    every = pa.concat_tables([FIELD_COUNTS.empty_table(), *(t.cast(FIELD_COUNTS) for t in parts)])
    return duck.query(
        """SELECT venue_id, field_id, sum(n)::BIGINT AS n FROM every GROUP BY ALL
        HAVING sum(n) <> 0 ORDER BY venue_id NULLS FIRST, field_id NULLS FIRST""",
        every=every,
    ).cast(FIELD_COUNTS)


def build_venues(
    storage: Storage, field_counts: pa.Table, venues_uri: str, sources_uri: str
) -> pa.Table:
    """The venues table: S2 venues and OpenAlex sources (parsed lists, bucket 0), with how
    many papers each venue has per field (`count_fields` at ingest; a refresh keeps the counts,
    adding what each step's papers edit changed)."""
    venues = _read_small(storage, venues_uri, "publication-venues")
    sources = _read_small(storage, sources_uri, "sources")
    return linking.assemble_venues(venues, sources, field_counts)


def _read_small(storage: Storage, uri: str, name: str) -> pa.Table:
    """The venue and source lists are small (~10^5 rows): one bucket holds all of them."""
    schema = ParseRecords(records.SPECS[name], 1, 1)(LINES.empty_table()).schema
    return read_parquet_bucket(storage, uri, 0, rows_schema(schema))


def _collect_rejects(
    storage: Storage,
    stage_uri: Callable[[str], str],
    inputs: dict[str, InputSet],
    out: str,
    cpus: float,
) -> str:
    """Quarantined lines of every input, in one table with their dataset, file and reason: one
    plain task per input with rejects (a Ray Data read and write here cost more to start than
    the copying itself)."""
    named = [
        (name, stage_uri(name))
        for name in inputs
        if buckets.count_rows(storage, stage_uri(name), buckets.REJECTED)
    ]
    run_buckets(len(named), partial(_copy_rejects, storage=storage, named=named, out=out), cpus)
    return out


def _copy_rejects(i: int, *, storage: Storage, named: Sequence[tuple[str, str]], out: str) -> None:
    """Input i's rejected lines, labelled, one output file per staging file (a retried task
    rewrites the same files)."""
    name, uri = named[i]
    parts = buckets.iter_bucket(storage, uri, buckets.REJECTED, ["path", "reject_reason", "raw"])
    for j, part in enumerate(parts):
        storage.write_parquet(_label_rejects(part, name), join(out, f"{name}-{j:05d}.parquet"))


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


def _check_not_empty(
    inputs: dict[str, InputSet], counts: dict[str, dict[str, int]], rejects_uri: str
) -> None:
    """A required input without one usable record cannot make a corpus: say which, and why."""
    for name, item in inputs.items():
        c = counts[name]
        if not item.required or c["kept"]:
            continue
        if not c["rejected"] and not c["skipped"]:
            raise InputError(
                f"required input {name!r} is empty: its {len(item.files) + len(item.empty)} "
                f"shard(s) under {item.uri} hold no lines"
            )
        raise InputError(
            f"required input {name!r} has no usable records: of its lines under {item.uri}, "
            f"{c['rejected']:,} were rejected (reasons in {rejects_uri}) and {c['skipped']:,} "
            "skipped by rule"
        )


def _duplicates_in_bucket(
    k: int, *, storage: Storage, uris: dict[str, str], threads: int
) -> pa.Table:
    """One bucket of every staging table: how many rows the newest-first rule will drop."""
    counts = {}
    for name, uri in uris.items():
        if buckets.count_rows(storage, uri, k):
            rows = storage.read_parquet(bucket_uri(uri, k), columns=linking.dedup_columns(name))
            counts[name] = linking.duplicates(name, rows, threads)
        else:
            counts[name] = 0
    return pa.table({name: pa.array([v], pa.int64()) for name, v in counts.items()})


def _count_duplicates(
    storage: Storage,
    stage_uri: Callable[[str], str],
    num_buckets: int,
    cpus: float,
    threads: int,
) -> dict[str, int]:
    """Duplicates (same key) per input, counted from the key columns only, one task per bucket."""
    uris = {name: stage_uri(name) for name in linking.DEDUP_KEYS}
    fn = partial(_duplicates_in_bucket, storage=storage, uris=uris, threads=threads)
    tables = run_buckets(num_buckets, fn, cpus)
    return {name: sum(pc.sum(t[name]).as_py() or 0 for t in tables) for name in uris}


def _print_summary(stats: dict[str, Any]) -> None:
    table = Table(title="ingest: lines by input", title_justify="left")
    cols = ("input", "kept", "duplicates dropped", "rejected", "skipped by rule", "shards")
    for col in cols:
        table.add_column(col, justify="right" if col != "input" else "left")
    for name, c in stats["inputs"].items():
        shards = f"{c['shards']:,}" + "".join(
            f" ({c[k]:,} {label})"
            for k, label in (("empty_shards", "empty"), ("quarantined_shards", "quarantined"))
            if c[k]
        )
        table.add_row(
            name,
            f"{c['kept']:,}",
            f"{c['duplicates']:,}",
            f"{c['rejected']:,}",
            f"{c['skipped']:,}",
            shards,
        )
    console.print(table)
    for q in stats["quarantined_shards"]:
        console.print(f"  [yellow]quarantined[/] {q['input']} shard {q['shard']}: {q['detail']}")
    keys = ", ".join(f"{k} {v:,}" for k, v in stats["join_by_key"].items())
    console.print(
        f"  papers {stats['papers']:,} (abstract {stats['papers_with_abstract']:,}, topics "
        f"{stats['papers_with_topics']:,}); linked to OpenAlex {stats['join_rate']:.1%} by key: "
        f"{keys}\n  citations {stats['citations']:,} ({stats['citations_with_context']:,} with a "
        f"citing sentence); venues {stats['venues']:,} "
        f"({stats['venues_linked_to_openalex']:,} linked to an OpenAlex source); "
        f"rejects {stats['rejects']:,}; topics from {stats['openalex_snapshot']}"
    )


def prepare_ingest(
    cfg: Config,
    storage: Storage,
    *,
    force: bool = False,
    inputs: dict[str, InputSet] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ingest's inputs (the shards' fingerprints, what a rerun compares) and its body's
    arguments (the shards).

    `inputs` are the shards `discover_inputs` found, when the caller checked them before
    starting Ray (`pipeline.run_build` does, with the storage root); otherwise they are listed
    here. A corpus a refresh has moved on is not ingested back to the bulk shards' release.
    """
    inputs = discover_inputs(cfg, storage) if inputs is None else inputs
    fingerprints = {name: item.fingerprint for name, item in inputs.items()}
    published = read_manifest(storage, INGEST) or {}
    corpus = published.get("corpus") or {}
    if corpus.get("applied") and published.get("inputs") != fingerprints and not force:
        raise InputError(
            f"the corpus under {storage.root} was refreshed to S2 release {corpus['release']}; "
            f"ingesting input.s2 again would take it back to {corpus['base_release']}. Run cpr "
            "refresh to update it, or cpr build --force to rebuild from the bulk shards"
        )
    return fingerprints, {"inputs": inputs}


# run (or skip) ingest and return its manifest: ingest(cfg, storage, inputs=…)
ingest = entry(INGEST)


__all__: Sequence[str] = ("ingest", "InputError")
