"""The `venues` and `mine` stages: top venues → base papers → cross-topic pairs + pooling universe.

Ingest writes the corpus tables in key buckets (`buckets`: papers by corpus id, citations
by citing id, each bucket its own Lance fragments), so every join is bucket k against bucket k
with DuckDB in one Ray task, reading only that bucket's fragments; the small sides (top venues,
base papers) are broadcast. Three passes: (1) per bucket of citing papers, the eligible base
papers and the ids of the pooling universe; (2) per bucket, the citations of the drawn base
papers, written to the buckets of the papers they cite; (3) per bucket of cited papers, the
topic-disjoint pairs and the universe rows. See ../shared/reference/PERF_NOTES.md for why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from cpr_ray.config import MiningConfig
from cpr_ray.corpus.tables import bucket_plan
from cpr_ray.errors import StorageError
from cpr_ray.mining import mine_incremental as incremental
from cpr_ray.mining import mining_rules as rules
from cpr_ray.mining.mining_sql import (
    CANDIDATE_COLUMNS,
    CANDIDATE_SQL,
    PAPER_COLUMNS,
    TOP_CITES_SQL,
    UNIVERSE_IDS_SQL,
    UNIVERSE_SCHEMA,
    UNIVERSE_SQL,
)
from cpr_ray.runs.stage_runner import Manifest, Phases, Reads, StageOutput, StageRun, console, entry
from cpr_ray.stages import INGEST, MINE, VENUES
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import buckets
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import BUCKET, read_parquet_bucket, run_buckets, write_partitions


def run_venues(run: StageRun, reads: Reads) -> StageOutput:
    """Select the top venues of every field from the ingested venues."""
    m = run.cfg.mining
    venues = run.storage.read_parquet(reads[INGEST]["tables"]["venues"]["uri"])
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


# -- mine --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Corpus:
    """The two corpus tables as bucket plans (see `buckets`), passed to bucket tasks."""

    storage: Storage
    papers: buckets.BucketPlan
    citations: buckets.BucketPlan

    def papers_of(self, k: int) -> pa.Table:
        return buckets.read_lance_bucket(self.papers, self.storage, k, PAPER_COLUMNS)

    def citations_of(self, k: int, columns: list[str], where: str | None = None) -> pa.Table:
        return buckets.read_lance_bucket(self.citations, self.storage, k, columns, where)

    def citations_schema(self, columns: list[str]) -> pa.Schema:
        return buckets.lance_schema(self.citations, self.storage, columns)


def _corpus(storage: Storage, ingest_m: Manifest) -> _Corpus:
    plans = {name: bucket_plan(storage, ingest_m, name) for name in ("papers", "citations")}
    if plans["papers"].layout.num_buckets != plans["citations"].layout.num_buckets:
        raise StorageError("the papers and citations tables are bucketed differently: re-ingest")
    return _Corpus(storage, plans["papers"], plans["citations"])


@dataclass(frozen=True)
class _EligibleAndIds:
    """Pass 1, one bucket of citing papers: its eligible base papers (capped per field) go back
    to the driver; the ids of the pooling universe it finds are written to their own buckets.
    What a refresh keeps of the bucket goes to `state_uri`: every eligible paper, uncapped, and
    the citations of its top-venue papers (`mine_incremental`)."""

    corpus: _Corpus
    top: pa.Table
    mining: MiningConfig
    ids_uri: str
    state_uri: str

    def __call__(self, k: int) -> pa.Table:
        storage, n = self.corpus.storage, self.corpus.papers.layout.num_buckets
        papers = self.corpus.papers_of(k)
        citations = self.corpus.citations_of(k, ["citing_id", "cited_id", "context_source"])
        with_context = citations.filter(rules.has_citing_sentence(citations)).select(["citing_id"])
        top_cites = duck.query(
            TOP_CITES_SQL,
            papers=papers.select(["corpus_id", "venue_id"]),
            citations=citations.select(["citing_id", "cited_id"]),
            top=self.top.select(["venue_id"]),
        ).cast(incremental.TOP_CITES_SCHEMA)
        ids = duck.query(
            UNIVERSE_IDS_SQL.format(n=n),
            papers=papers.select(["corpus_id", "venue_id"]),
            top_cites=top_cites,
            top=self.top.select(["venue_id"]),
        )
        write_partitions(ids, self.ids_uri, storage, str(k))
        eligible = rules.eligible_base_papers(
            papers, self.top, with_context, **rules.eligibility(self.mining)
        )
        part = f"part-{k:05d}.parquet"
        storage.write_parquet(eligible, join(self.state_uri, "eligible", part))
        storage.write_parquet(top_cites, join(self.state_uri, "top_cites", part))
        return rules.cap_per_bucket(eligible, self.mining.base_per_field, n)


@dataclass(frozen=True)
class _Candidates:
    """Pass 2, one bucket of citing papers: the citations of its base papers, text included,
    read with the ids pushed into Lance and written to the buckets of the cited papers."""

    corpus: _Corpus
    base: pa.Table
    out: str

    def __call__(self, k: int) -> int:
        n = self.corpus.citations.layout.num_buckets
        mine = self.base.filter(pc.equal(pc.remainder(self.base["corpus_id"], n), k))
        if not mine.num_rows:
            return 0
        ids = ", ".join(str(i) for i in mine["corpus_id"].to_pylist())
        citations = self.corpus.citations_of(
            k, [*CANDIDATE_COLUMNS, "is_influential"], f"citing_id IN ({ids})"
        )
        candidates = duck.query(CANDIDATE_SQL.format(n=n), citations=citations, base=mine)
        write_partitions(candidates, self.out, self.corpus.storage, str(k))
        return candidates.num_rows


@dataclass(frozen=True)
class _PairsAndUniverse:
    """Pass 3, one bucket of cited papers: topic-disjoint pairs of the candidates citing them
    (back to the driver), and the universe members among them (written as one part); the
    candidates are kept for the next refresh as one file of the bucket (`kept_uri`)."""

    corpus: _Corpus
    top: pa.Table
    candidates_uri: str
    candidates_schema: pa.Schema
    ids_uri: str
    universe_uri: str
    kept_uri: str

    def __call__(self, k: int) -> tuple[pa.Table, int]:
        storage = self.corpus.storage
        papers = self.corpus.papers_of(k)
        candidates = read_parquet_bucket(storage, self.candidates_uri, k, self.candidates_schema)
        storage.write_parquet(candidates, join(self.kept_uri, f"{BUCKET}={k}", "part-0.parquet"))
        pairs = rules.cross_topic_pairs(candidates, papers)
        ids = read_parquet_bucket(storage, self.ids_uri, k, pa.schema([("id", pa.int64())]))
        universe = duck.query(
            UNIVERSE_SQL, papers=papers, ids=ids, top=self.top.select(["venue_id"])
        ).cast(UNIVERSE_SCHEMA)
        storage.write_parquet(universe, join(self.universe_uri, f"part-{k:05d}.parquet"))
        return pairs, universe.num_rows


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


def run_mine(run: StageRun, reads: Reads) -> StageOutput:
    """Mine topic-disjoint citation pairs of base papers, and the pooling universe: in full, or
    (a refresh with the last run's kept state and a record of the corpus changes since) only
    for the rows the changes reach (`mine_incremental`); both publish the same tables."""
    cfg, storage, m = run.cfg, run.storage, run.cfg.mining
    ingest_m, venues_m = reads[INGEST], reads[VENUES]
    phase = Phases()

    with phase("plan"):
        corpus = _corpus(storage, ingest_m)
        n = corpus.papers.layout.num_buckets
        top = storage.read_parquet(venues_m["tables"]["top_venues"]["uri"])
        kept = incremental.previous(cfg, storage, ingest_m, n)
        if isinstance(kept, str):
            mixed = {name: getattr(corpus, name) for name in ("papers", "citations")}
            console.print(
                f"  mining every row ({kept}): the corpus in its {n} key buckets; rows in "
                "fragments that mix buckets (an earlier refresh's, scanned by every bucket): "
                + ", ".join(f"{name} {p.mixed_rows:,} of {p.rows:,}" for name, p in mixed.items())
            )
        else:
            console.print(
                f"  mining the rows the corpus changes reach since ingest run "
                f"{kept.manifest['inputs'][INGEST]}, from run {kept.manifest['run_id']}'s kept "
                f"state: {len(kept.changes.papers):,} papers and the citations of "
                f"{len(kept.changes.citing):,} changed"
            )
    if isinstance(kept, str):
        mined = _mine_every_row(run, corpus, top, phase)
        mined.said["why"] = kept
    else:
        try:
            mined = incremental.mine(
                storage,
                m,
                corpus.papers,
                corpus.citations,
                top,
                kept,
                run.out,
                cfg.ingest.cpus_per_task,
                phase,
            )
        except (StorageError, OSError, pa.ArrowInvalid) as exc:  # a kept file damaged or gone
            why = (
                f"run {kept.manifest['run_id']}'s kept state is unreadable: "
                + (str(exc).splitlines() or [type(exc).__name__])[0]
            )
            console.print(f"  mining every row ({why})")
            for folder in ("state", "universe"):  # what the attempt wrote: not mixed into it
                storage.delete_dir(join(run.out, folder))
            mined = _mine_every_row(run, corpus, top, phase)
            mined.said["why"] = why

    pairs_all, base = mined.pairs_all, mined.base
    n_pairs = pairs_all.num_rows
    without_context = n_pairs - (pc.sum(pairs_all["has_context"]).as_py() or 0)
    pairs = (
        pairs_all if m.keep_pairs_without_context else pairs_all.filter(pairs_all["has_context"])
    )
    pairs_uri = join(run.out, "pairs.parquet")
    storage.write_parquet(pairs, pairs_uri)
    base_uri = join(run.out, "base_papers.parquet")
    storage.write_parquet(base, base_uri)

    stats = pair_statistics(pairs)
    stats.update(
        {
            "base_papers": base.num_rows,
            "eligible_per_field": {
                r["field"]: {"eligible": r["eligible"], "drawn": r["drawn"]}
                for r in mined.report.to_pylist()
            },
            "universe": mined.universe_rows,
            "cross_topic_citations": n_pairs,
            "pairs_without_context": without_context,
            "pairs_without_context_dropped": 0 if m.keep_pairs_without_context else without_context,
            "phase_seconds": phase.seconds,
            "incremental": mined.said,
        }
    )
    stats_uri = join(run.out, "stats.json")
    run.storage.write_json(stats_uri, stats)
    _print_mining(stats)
    return StageOutput(
        tables={
            "pairs": {"uri": pairs_uri, "format": "parquet", "rows": pairs.num_rows},
            "base_papers": {"uri": base_uri, "format": "parquet", "rows": base.num_rows},
            "universe": {
                "uri": join(run.out, "universe"),
                "format": "parquet",
                "rows": mined.universe_rows,
            },
            # what the next refresh's mine starts from (rows: the eligible base papers)
            "state": {
                "uri": join(run.out, "state"),
                "format": "parquet",
                "rows": sum(r["eligible"] for r in mined.report.to_pylist()),
                "layout": {"state_version": incremental.STATE_VERSION, "num_buckets": n},
            },
        },
        stats=stats,
    )


def _mine_every_row(
    run: StageRun, corpus: _Corpus, top: pa.Table, phase: Phases
) -> incremental.Mined:
    """The build's mine: every bucket of the corpus read, in three passes (module docstring);
    what a refresh will start from is kept under the run's `state` folder."""
    storage, m = run.storage, run.cfg.mining
    n = corpus.papers.layout.num_buckets
    cpus = run.cfg.ingest.cpus_per_task
    work, state_uri = join(run.out, "_work"), join(run.out, "state")

    with phase("base_papers"):
        # pass 1 per bucket of citing papers: eligible (capped per field) + universe ids
        console.print("  base papers: eligibility per bucket, then the same number per field")
        ids_uri = join(work, "universe_ids")
        eligible_parts = run_buckets(n, _EligibleAndIds(corpus, top, m, ids_uri, state_uri), cpus)
        eligible = pa.concat_tables(eligible_parts)
        base, report = rules.sample_per_field(eligible, m.base_per_field)

    with phase("candidates"):
        # pass 2: citations of base papers (with their text), to the buckets of the cited
        console.print(f"  pairs: citations of {base.num_rows:,} base papers, topic-disjoint")
        candidates_uri = join(work, "candidates")
        run_buckets(n, _Candidates(corpus, base, candidates_uri), cpus)

    with phase("pairs_universe"):
        # pass 3 per bucket of cited papers: topic-disjoint pairs, and the pooling universe
        console.print("  pooling universe: top-venue papers and what they cite")
        universe_uri = join(run.out, "universe")
        candidates_schema = incremental.candidate_schema(storage, corpus.citations, base.schema)
        found = run_buckets(
            n,
            _PairsAndUniverse(
                corpus,
                top,
                candidates_uri,
                candidates_schema,
                ids_uri,
                universe_uri,
                join(state_uri, "candidates"),
            ),
            cpus,
        )
        pairs_all = duck.query(
            "SELECT * FROM pairs ORDER BY base_id, cited_id",
            pairs=pa.concat_tables([p for p, _ in found]),
        ).cast(rules.PAIR_SCHEMA)
        incremental.write_state(storage, state_uri, {"pairs_all": pairs_all, "top_venues": top}, n)
    storage.delete_dir(work)
    return incremental.Mined(base, report, pairs_all, sum(u for _, u in found), {"path": "full"})


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
    console.print(f"  {mining_summary(stats)}")


def mining_summary(stats: dict[str, Any]) -> str:
    """The line under the per-field table: pairs kept, crossings, citing sentences (and how many
    pairs were dropped for want of one: the method reads how q cites d), the pooling universe."""
    dropped = stats.get("pairs_without_context_dropped", 0)
    context = (
        f"{dropped:,} of {stats['cross_topic_citations']:,} cross-topic pairs dropped for having "
        "no citing sentence (mining.keep_pairs_without_context: false)"
        if dropped
        else f"{stats.get('pairs_without_context', 0):,} pairs without a citing sentence kept"
    )
    universe = f"pooling universe {stats['universe']:,} papers"
    if not stats.get("pairs"):
        return f"no pairs; {context}; {universe}"
    return (
        f"{stats['pairs']:,} pairs from {stats['base_papers_with_pairs']:,} of "
        f"{stats['base_papers']:,} base papers; crossing field "
        f"{stats['share_crossing_field']:.1%}, domain {stats['share_crossing_domain']:.1%} "
        "(the paper's final positives: 79.9% / 45.3%); with a citing sentence "
        f"{stats['share_with_context']:.1%}; {context}; {universe}"
    )


# run (or skip) each stage and return its manifest
venues = entry(VENUES)
mine = entry(MINE)


__all__ = ["venues", "mine", "pair_statistics"]
