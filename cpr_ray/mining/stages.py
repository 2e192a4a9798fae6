"""The `venues` and `mine` stages: top venues → base papers → cross-topic pairs + pooling universe.

The corpus tables are Lance (ordered by nothing useful for joins), so `mine` first writes a
per-build snapshot of papers bucketed by corpus id and of citations bucketed by citing id; every
join after that is bucket k against bucket k with DuckDB in one Ray task, and the small sides
(top venues, base papers) are broadcast. See ../shared/reference/PERF_NOTES.md for why.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
from rich.table import Table

from cpr_ray import duck
from cpr_ray.buckets import BUCKET, map_buckets, read_bucket, write_bucketed
from cpr_ray.config import Config
from cpr_ray.mining import rules
from cpr_ray.stage import Phases, StageOutput, StageRun, console, require_manifest, run_stage
from cpr_ray.storage import Storage, join

PAPER_COLUMNS = [
    "corpus_id",
    "venue_id",
    "year",
    "publication_date",
    "abstract_length",
    "topics",
    "field_id",
    "field",
    "domain_id",
    "domain",
]
SNAPSHOT_CITATIONS = pa.schema(
    [("citing_id", pa.int64()), ("cited_id", pa.int64()), ("has_context", pa.bool_())]
)


def _run_venues(run: StageRun, venues_uri: str) -> StageOutput:
    m = run.cfg.mining
    venues = run.storage.read_parquet(venues_uri)
    top = rules.top_venues(
        venues,
        top_share=m.top_share,
        min_papers=m.min_venue_papers,
        conference_policy=m.conference_policy,
    )
    uri = join(run.out, "top_venues.parquet")
    run.storage.write_parquet(top, uri)
    per_field = duck.query(
        "SELECT field, count(*) AS venues, sum(n_papers) AS papers FROM top "
        "GROUP BY field ORDER BY field",
        top=top,
    ).to_pylist()
    stats = {
        "venues_in": venues.num_rows,
        "top_venues": top.num_rows,
        "fields_with_top_venues": len(per_field),
        "per_field": {
            r["field"]: {"venues": r["venues"], "papers": r["papers"]} for r in per_field
        },
    }
    console.print(
        f"  top venues: {top.num_rows:,} of {venues.num_rows:,} venues in "
        f"{len(per_field)} fields (top {m.top_share:.0%} per field by 2-year mean citedness, "
        f"≥{m.min_venue_papers} papers, conferences: {m.conference_policy})"
    )
    return StageOutput(
        tables={"top_venues": {"uri": uri, "format": "parquet", "rows": top.num_rows}},
        stats=stats,
    )


def venues(cfg: Config, storage: Storage, *, force: bool = False) -> dict[str, Any]:
    """Select the top venues of every field from the ingested venues."""
    upstream = require_manifest(storage, "ingest")
    return run_stage(
        "venues",
        cfg,
        storage,
        inputs={"ingest": upstream["run_id"]},
        config_sections=("mining",),
        fn=partial(_run_venues, venues_uri=upstream["tables"]["venues"]["uri"]),
        force=force,
    )


# -- mine --------------------------------------------------------------------------------------


def _paper_snapshot_batch(batch: pa.Table, num_buckets: int) -> pa.Table:
    bucket = pc.cast(pc.remainder(batch["corpus_id"], num_buckets), pa.int32())
    return batch.append_column(BUCKET, bucket)


def _citation_snapshot_batch(batch: pa.Table, num_buckets: int, citing: pa.Array) -> pa.Table:
    """Only citations *from* top-venue papers can yield a pair or a universe member: keep those,
    as (citing, cited, has a citing sentence). Their text is fetched later for the few pairs."""
    keep = batch.filter(pc.is_in(batch["citing_id"], value_set=citing))
    bucket = pc.cast(pc.remainder(keep["citing_id"], num_buckets), pa.int32())
    return pa.table(
        {
            "citing_id": keep["citing_id"],
            "cited_id": keep["cited_id"],
            "has_context": rules.has_citing_sentence(keep),
            BUCKET: bucket,
        }
    )


def _snapshot(
    storage: Storage,
    lance_uri: str,
    columns: list[str],
    fn: Any,
    out: str,
    **kwargs: Any,
) -> None:
    ds = ray.data.read_lance(lance_uri, columns=columns, storage_options=storage.lance_options())
    ds = ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pyarrow")
    write_bucketed(ds, out, storage, min_rows_per_file=50_000)


def _gather(ds: ray.data.Dataset, schema: pa.Schema) -> pa.Table:
    """Small per-bucket results (bounded by config) to the driver."""
    tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    return pa.concat_tables(tables).cast(schema) if tables else schema.empty_table()


class _Sides:
    """Schemas and locations of the snapshot tables, passed to per-bucket tasks."""

    def __init__(self, storage: Storage, root: str, papers: pa.Schema, citations: pa.Schema):
        self.storage, self.root = storage, root
        self.schemas = {"papers": papers, "citations": citations}

    def read(self, name: str, k: int, schema: pa.Schema | None = None) -> pa.Table:
        return read_bucket(self.storage, join(self.root, name), k, schema or self.schemas[name])


def _eligible_bucket(
    k: int, *, sides: _Sides, top: pa.Table, cfg: Config, cap: int | None
) -> pa.Table:
    citations = sides.read("citations", k)
    with_context = citations.filter(citations["has_context"]).select(["citing_id"])
    papers = sides.read("papers", k)
    options = rules.eligibility(cfg.mining)
    return rules.eligible_base_papers(papers, top, with_context, per_field_cap=cap, **options)


CANDIDATE_SQL = """
SELECT c.citing_id AS base_id, c.cited_id, NULL::VARCHAR[] AS contexts,
       NULL::VARCHAR AS context_source, NULL::VARCHAR[] AS intents,
       NULL::BOOLEAN AS is_influential, b.topic_ids AS base_topics, b.top_topic AS base_top_topic,
       b.field_id AS base_field_id, b.field AS base_field, b.domain AS base_domain,
       b.primary_field_id AS base_primary_field_id, b.primary_domain_id AS base_primary_domain_id,
       CAST(c.cited_id % {n} AS INTEGER) AS _bucket
FROM citations c JOIN base b ON b.corpus_id = c.citing_id
"""


def _candidates_bucket(k: int, *, sides: _Sides, base: pa.Table, num_buckets: int) -> pa.Table:
    mine = base.filter(pc.equal(pc.remainder(base["corpus_id"], num_buckets), k))
    return duck.query(
        CANDIDATE_SQL.format(n=num_buckets), citations=sides.read("citations", k), base=mine
    )


def _attach_citation_text(storage: Storage, citations_uri: str, pairs: pa.Table) -> pa.Table:
    """Citing sentences, intents and influence of the (few) mined pairs, read from Lance with the
    base ids pushed down."""
    text = lance.dataset(citations_uri, storage_options=storage.lance_options()).to_table(
        columns=[
            "citing_id",
            "cited_id",
            "contexts",
            "context_source",
            "intents",
            "is_influential",
        ],
        filter=pc.field("citing_id").isin(pc.unique(pairs["base_id"])),
    )
    out = duck.query(
        """SELECT p.* REPLACE (c.contexts AS contexts, c.context_source AS context_source,
                              c.intents AS intents, c.is_influential AS is_influential,
                              len(coalesce(c.contexts, [])) > 0 AS has_context)
           FROM pairs p LEFT JOIN text c ON c.citing_id = p.base_id AND c.cited_id = p.cited_id
           ORDER BY p.base_id, p.cited_id""",
        pairs=pairs,
        text=text,
    )
    return out.cast(rules.PAIR_SCHEMA)


def _pairs_bucket(k: int, *, sides: _Sides, candidates_schema: pa.Schema) -> pa.Table:
    candidates = sides.read("candidates", k, candidates_schema)
    return rules.cross_topic_pairs(candidates, sides.read("papers", k))


UNIVERSE_IDS_SQL = """
SELECT DISTINCT id, CAST(id % {n} AS INTEGER) AS _bucket FROM (
    SELECT p.corpus_id AS id FROM papers p JOIN top t ON t.venue_id = p.venue_id
    UNION ALL
    SELECT c.cited_id FROM citations c
    JOIN papers p ON p.corpus_id = c.citing_id JOIN top t ON t.venue_id = p.venue_id
)
"""

UNIVERSE_SCHEMA = pa.schema(
    [
        ("corpus_id", pa.int64()),
        ("year", pa.int32()),
        ("publication_date", pa.date32()),
        ("field_id", pa.int32()),
        ("domain_id", pa.int32()),
        ("in_top_venue", pa.bool_()),
    ]
)


def _universe_ids_bucket(k: int, *, sides: _Sides, top: pa.Table, num_buckets: int) -> pa.Table:
    return duck.query(
        UNIVERSE_IDS_SQL.format(n=num_buckets),
        papers=sides.read("papers", k),
        citations=sides.read("citations", k),
        top=top.select(["venue_id"]),
    )


def _universe_bucket(k: int, *, sides: _Sides, ids_schema: pa.Schema, top: pa.Table) -> pa.Table:
    sql = """
    SELECT p.corpus_id, p.year, p.publication_date, p.field_id, p.domain_id,
           p.venue_id IN (SELECT venue_id FROM top) AS in_top_venue
    FROM papers p JOIN (SELECT DISTINCT id FROM ids) i ON i.id = p.corpus_id
    WHERE p.abstract_length > 0 AND p.publication_date IS NOT NULL
    """
    out = duck.query(
        sql,
        papers=sides.read("papers", k),
        ids=sides.read("universe_ids", k, ids_schema),
        top=top.select(["venue_id"]),
    )
    return out.cast(UNIVERSE_SCHEMA)


def pair_statistics(pairs: pa.Table) -> dict[str, Any]:
    """What a build reports about its pairs: per field and domain, crossing and context shares."""
    n = pairs.num_rows
    if n == 0:
        return {"pairs": 0}
    share = {
        name: round(pc.sum(pc.cast(pairs[name], pa.int64())).as_py() / n, 4)
        for name in ("crosses_field", "crosses_domain", "has_context")
    }
    by = duck.query(
        """SELECT base_field, base_domain, count(*) AS pairs, count(DISTINCT base_id) AS bases,
                  avg(crosses_field::INT) AS crosses_field,
                  avg(crosses_domain::INT) AS crosses_domain
           FROM pairs GROUP BY ALL ORDER BY base_domain, base_field""",
        pairs=pairs,
    ).to_pylist()
    per_domain = duck.query(
        "SELECT base_domain, count(*) AS pairs FROM pairs GROUP BY ALL ORDER BY base_domain",
        pairs=pairs,
    ).to_pylist()
    return {
        "pairs": n,
        "base_papers_with_pairs": pc.count_distinct(pairs["base_id"]).as_py(),
        "share_crossing_field": share["crosses_field"],
        "share_crossing_domain": share["crosses_domain"],
        "share_with_context": share["has_context"],
        "per_field": {
            r["base_field"]: {
                "domain": r["base_domain"],
                "pairs": r["pairs"],
                "base_papers": r["bases"],
                "share_crossing_field": round(r["crosses_field"], 4),
                "share_crossing_domain": round(r["crosses_domain"], 4),
            }
            for r in by
        },
        "per_domain": {r["base_domain"]: r["pairs"] for r in per_domain},
    }


def _run_mine(run: StageRun, ingest_m: dict[str, Any], venues_m: dict[str, Any]) -> StageOutput:
    cfg, storage, m = run.cfg, run.storage, run.cfg.mining
    n = m.num_buckets
    cpus = cfg.ingest.cpus_per_task
    snap = join(run.out, "_snapshot")
    phase = Phases()

    with phase("snapshot"):
        opts = storage.lance_options()
        papers_uri = ingest_m["tables"]["papers"]["uri"]
        citations_uri = ingest_m["tables"]["citations"]["uri"]
        top = storage.read_parquet(venues_m["tables"]["top_venues"]["uri"])
        # ids of top-venue papers: pushed down to Lance; broadcast to the citation scan
        top_papers = (
            lance.dataset(papers_uri, storage_options=opts)
            .to_table(columns=["corpus_id"], filter=pc.field("venue_id").isin(top["venue_id"]))[
                "corpus_id"
            ]
            .combine_chunks()
        )
        console.print(
            f"  snapshot: papers, and citations of {len(top_papers):,} top-venue papers, into {n} "
            "key buckets"
        )
        _snapshot(
            storage,
            papers_uri,
            PAPER_COLUMNS,
            _paper_snapshot_batch,
            join(snap, "papers"),
            num_buckets=n,
        )
        _snapshot(
            storage,
            citations_uri,
            ["citing_id", "cited_id", "context_source"],
            _citation_snapshot_batch,
            join(snap, "citations"),
            num_buckets=n,
            citing=top_papers,
        )
        lance_schema = lance.dataset(papers_uri, storage_options=opts).schema
        paper_schema = pa.schema([lance_schema.field(c) for c in PAPER_COLUMNS])
        sides = _Sides(storage, snap, paper_schema, SNAPSHOT_CITATIONS)

    with phase("base_papers"):
        # base papers: per bucket eligible (capped when a per-field count is set), then sample
        console.print("  base papers: eligibility per bucket, then the same number per field")
        eligible_schema = _eligible_bucket(
            0, sides=_EmptySides(sides), top=top, cfg=cfg, cap=None
        ).schema
        eligible = _gather(
            map_buckets(
                n,
                partial(_eligible_bucket, sides=sides, top=top, cfg=cfg, cap=m.base_per_field),
                cpus,
            ),
            eligible_schema,
        )
        base, report = rules.sample_per_field(eligible, m.base_per_field)

    with phase("pairs"):
        # candidate citations of base papers, re-bucketed by cited id; then topic-disjoint pairs
        console.print(f"  pairs: citations of {base.num_rows:,} base papers, topic-disjoint")
        write_bucketed(
            map_buckets(
                n, partial(_candidates_bucket, sides=sides, base=base, num_buckets=n), cpus
            ),
            join(snap, "candidates"),
            storage,
            10_000,
        )
        candidates_schema = duck.query(
            CANDIDATE_SQL.format(n=n),
            citations=SNAPSHOT_CITATIONS.empty_table(),
            base=base.schema.empty_table(),
        ).schema
        candidates_schema = candidates_schema.remove(candidates_schema.get_field_index(BUCKET))
        found = _gather(
            map_buckets(
                n, partial(_pairs_bucket, sides=sides, candidates_schema=candidates_schema), cpus
            ),
            rules.PAIR_SCHEMA,
        )
        pairs_all = _attach_citation_text(storage, citations_uri, found)
        n_pairs = pairs_all.num_rows
        without_context = n_pairs - (pc.sum(pairs_all["has_context"]).as_py() or 0)
        pairs = (
            pairs_all
            if m.keep_pairs_without_context
            else pairs_all.filter(pairs_all["has_context"])
        )
        pairs_uri = join(run.out, "pairs.parquet")
        storage.write_parquet(pairs, pairs_uri)

    with phase("universe"):
        # pooling universe: top-venue papers and the papers they cite, with abstract and date
        console.print("  pooling universe: top-venue papers and what they cite")
        write_bucketed(
            map_buckets(
                n, partial(_universe_ids_bucket, sides=sides, top=top, num_buckets=n), cpus
            ),
            join(snap, "universe_ids"),
            storage,
            50_000,
        )
        ids_schema = pa.schema([("id", pa.int64())])
        universe_uri = join(run.out, "universe")
        uloc = storage.resolve(universe_uri)
        map_buckets(
            n, partial(_universe_bucket, sides=sides, ids_schema=ids_schema, top=top), cpus
        ).write_parquet(uloc.path, filesystem=uloc.fs, try_create_dir=not uloc.is_s3)
        universe_rows = (
            pq.ParquetDataset(uloc.path, filesystem=uloc.fs).read(columns=["corpus_id"]).num_rows
        )

    base_uri = join(run.out, "base_papers.parquet")
    storage.write_parquet(base, base_uri)
    storage.delete_dir(snap)

    stats = pair_statistics(pairs)
    stats.update(
        {
            "base_papers": base.num_rows,
            "eligible_per_field": {
                r["field"]: {"eligible": r["eligible"], "drawn": r["drawn"]}
                for r in report.to_pylist()
            },
            "universe": universe_rows,
            "cross_topic_citations": n_pairs,
            "pairs_without_context": without_context,
            "pairs_without_context_dropped": 0 if m.keep_pairs_without_context else without_context,
            "phase_seconds": phase.seconds,
        }
    )
    stats_uri = join(run.out, "stats.json")
    run.storage.write_json(stats_uri, stats)
    _print_mining(stats)
    return StageOutput(
        tables={
            "pairs": {"uri": pairs_uri, "format": "parquet", "rows": pairs.num_rows},
            "base_papers": {"uri": base_uri, "format": "parquet", "rows": base.num_rows},
            "universe": {"uri": universe_uri, "format": "parquet", "rows": universe_rows},
        },
        stats=stats,
    )


class _EmptySides(_Sides):
    """Stands in for the snapshot when only an output schema is wanted."""

    def __init__(self, sides: _Sides):
        super().__init__(sides.storage, sides.root, **sides.schemas)

    def read(self, name: str, k: int, schema: pa.Schema | None = None) -> pa.Table:
        return (schema or self.schemas[name]).empty_table()


def _print_mining(stats: dict[str, Any]) -> None:
    table = Table(title="mine: base papers and cross-topic pairs per field", title_justify="left")
    for col in ("field", "eligible", "drawn", "pairs", "cross-field", "cross-domain"):
        table.add_column(col, justify="left" if col == "field" else "right")
    per_field = stats.get("per_field", {})
    for field, e in sorted(stats["eligible_per_field"].items()):
        p = per_field.get(field, {})
        table.add_row(
            field,
            f"{e['eligible']:,}",
            f"{e['drawn']:,}",
            f"{p.get('pairs', 0):,}",
            f"{p.get('share_crossing_field', 0):.0%}",
            f"{p.get('share_crossing_domain', 0):.0%}",
        )
    console.print(table)
    if stats.get("pairs"):
        console.print(
            f"  {stats['pairs']:,} pairs from {stats['base_papers_with_pairs']:,} of "
            f"{stats['base_papers']:,} base papers; crossing field "
            f"{stats['share_crossing_field']:.1%}, domain {stats['share_crossing_domain']:.1%} "
            "(the paper's final positives: 79.9% / 45.3%); with a citing sentence "
            f"{stats['share_with_context']:.1%} ({stats['pairs_without_context']:,} without, "
            f"{stats['pairs_without_context_dropped']:,} of them dropped); pooling universe "
            f"{stats['universe']:,} papers"
        )
    else:
        console.print(f"  no pairs; pooling universe {stats['universe']:,} papers")


def mine(cfg: Config, storage: Storage, *, force: bool = False) -> dict[str, Any]:
    """Mine topic-disjoint citation pairs of base papers, and the pooling universe."""
    ingest_m = require_manifest(storage, "ingest")
    venues_m = require_manifest(storage, "venues")
    return run_stage(
        "mine",
        cfg,
        storage,
        inputs={"ingest": ingest_m["run_id"], "venues": venues_m["run_id"]},
        config_sections=("mining",),
        fn=partial(_run_mine, ingest_m=ingest_m, venues_m=venues_m),
        force=force,
    )


__all__ = ["venues", "mine", "pair_statistics"]
