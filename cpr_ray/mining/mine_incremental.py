"""The `mine` stage of a refresh, in proportion to the diff: what the last run kept, brought up
to date for the rows the corpus changes reach, equal to a full mine of the updated corpus.

**What a run keeps** (its `state` folder, beside its outputs; `mining_stages.run_mine` writes it
on either path): every eligible base paper with its sampling key (`eligible`), the citations of
the drawn base papers with the base side attached (`candidates`), every cross-topic pair before
the citing-sentence filter (`pairs_all`), the citations whose citing paper is in a top venue
(`top_cites`: what puts a cited paper in the pooling universe) and the top venues it mined with.

**What a diff reaches.** The corpus-changes record (`corpus_changes.changes_between`) names the
papers inserted, updated or deleted and the citing papers whose citation rows changed since the
ingest run the last mine read. A paper's eligibility and its row depend only on its own paper
row, its own citations and its venue's rank, so the *dirty* papers are those changed papers and
citing papers, plus every paper of a venue whose top-venue row changed (it entered or left the
top share, or its field moved): exactly those are read again, by id, from their key buckets.
From them, per the method's rules (`mining_rules`):

- *eligible*: the kept rows of the dirty papers are replaced by theirs, recomputed;
- *the per-field base sampling*: redrawn from every kept eligible key (a sort over keys, the
  same `cap_per_bucket` and `sample_per_field` a build runs): a paper that leaves the draw lets
  the next one in, so the draw is recomputed exactly rather than maintained;
- *candidates and pairs*: recomputed for the base papers that are dirty or newly drawn (their
  citations read again) and for every kept candidate citing a changed paper (that paper read
  again); the pairs of base papers no longer drawn go;
- *the pooling universe*: the membership of a paper is its own venue or a top-venue paper citing
  it, so it is recomputed for the dirty papers and for every paper a dirty paper cited before or
  cites now (`top_cites`); the other universe rows are kept, a bucket without any such paper
  copied as it was.

**Venue ranks** are recomputed from the whole venues table by the `venues` stage every night
(cheap: a row per venue); this stage compares them with the ranks it mined with to find the
venues that crossed the line. Nothing else is kept from a previous night.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import Config, MiningConfig
from cpr_ray.corpus.corpus_changes import CorpusChanges, changes_between
from cpr_ray.mining import mining_rules as rules
from cpr_ray.mining import mining_sql as full  # the full path's SQL and columns
from cpr_ray.runs.stage_runner import Manifest, Phases, read_manifest
from cpr_ray.stages import INGEST, MINE, stage
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import buckets
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.buckets import BUCKET, BucketPlan, planned_fragment, run_buckets

# the layout of the kept state: a run that finds another version mines in full
STATE_VERSION = 1
STATE_TABLES = ("eligible", "candidates", "pairs_all", "top_cites", "top_venues")
# dirty ids a bucket task reads at most: a small diff reads all its buckets in one task
IDS_PER_TASK = 20_000
TOP_CITES_SCHEMA = pa.schema([("citing_id", pa.int64()), ("cited_id", pa.int64())])
TOP_ROW = ["venue_id", "field_id", "field", "domain_id", "domain"]


@dataclass(frozen=True)
class Kept:
    """What the previous mine run kept, and what the corpus changed since the ingest it read."""

    manifest: Manifest
    state_uri: str
    changes: CorpusChanges


def previous(cfg: Config, storage: Storage, ingest_m: Manifest, num_buckets: int) -> Kept | str:
    """The previous run's kept state and the changes since, or why the stage mines in full."""
    if not cfg.refresh.incremental:
        return "refresh.incremental is false"
    prev = read_manifest(storage, MINE)
    if prev is None:
        return "no previous run"
    state = prev.get("tables", {}).get("state")
    layout: dict[str, Any] = (state.get("layout") if state else None) or {}
    if not prev.get("complete", True):
        return f"run {prev['run_id']} was incomplete"
    if prev.get("config_hash") != cfg.section_hash(*stage(MINE).config_sections):
        return f"the mining config differs from run {prev['run_id']}'s"
    if state is None or layout.get("state_version") != STATE_VERSION:
        return f"run {prev['run_id']} kept no state of this version"
    if layout.get("num_buckets") != num_buckets:
        return f"the corpus is bucketed differently from run {prev['run_id']}'s"
    missing = [t for t in STATE_TABLES if not storage.exists(join(state["uri"], t))]
    if missing or not storage.exists(prev["tables"]["universe"]["uri"]):
        return f"run {prev['run_id']}'s kept state is incomplete ({', '.join(missing)})"
    since = (prev.get("inputs") or {}).get(INGEST)
    changes = changes_between(storage, ingest_m, since) if since else None
    if changes is None:
        return f"the corpus changes since ingest run {since} are not recorded"
    return Kept(prev, state["uri"], changes)


def read_state(storage: Storage, uri: str, name: str) -> pa.Table:
    """One kept table, a folder of parts (`candidates`: of bucket folders)."""
    return storage.read_parquet(join(uri, name))


def read_candidates(storage: Storage, uri: str, schema: pa.Schema) -> pa.Table:
    table = buckets.bucketed_dataset(storage, join(uri, "candidates")).to_table()
    return table.select(schema.names).cast(schema) if table.num_rows else schema.empty_table()


def candidate_schema(storage: Storage, citations: BucketPlan, base: pa.Schema) -> pa.Schema:
    """The columns of a candidate (`mining_sql.CANDIDATE_SQL`, its bucket column left out)."""
    columns = [*full.CANDIDATE_COLUMNS, "is_influential"]
    schema = duck.query(
        full.CANDIDATE_SQL.format(n=citations.layout.num_buckets),
        citations=buckets.lance_schema(citations, storage, columns).empty_table(),
        base=base.empty_table(),
    ).schema
    return schema.remove(schema.get_field_index(BUCKET))


def copy_file(storage: Storage, src: str, dst: str) -> None:
    """A kept file into the new run (a server-side copy on S3): a run folder owns its files."""
    a, b = storage.resolve(src), storage.resolve(dst)
    storage.make_dirs(posixpath.dirname(b.uri))
    a.fs.copy_file(a.path, b.path)


def in_list(column: str, values: Iterable[Any]) -> str:
    """A Lance predicate `column IN (...)` over ids or strings."""
    items = [
        f"'{v.replace(chr(39), chr(39) * 2)}'" if isinstance(v, str) else str(int(v))
        for v in values
    ]
    return f"{column} IN ({', '.join(items)})"


def read_ids(
    p: BucketPlan, storage: Storage, ks: list[int], key: str, ids: np.ndarray, columns: list[str]
) -> pa.Table:
    """The rows of `ids` (all in buckets `ks`) in one Lance scan of those buckets' fragments and
    of the fragments that mix buckets, the ids pushed into Lance: a task's several buckets cost
    one scan, not one a bucket."""
    ds = storage.open_lance(p.uri, p.version)
    schema = pa.schema([ds.schema.field(c) for c in columns])
    fragments = [i for k in ks for i in p.by_bucket[k]] + p.mixed
    if not len(ids) or not fragments:
        return schema.empty_table()
    scanner = ds.scanner(
        fragments=[planned_fragment(ds, i) for i in fragments],
        columns=columns,
        filter=in_list(key, ids.tolist()),
    )
    return scanner.to_table().cast(schema)


def groups(ids: np.ndarray, num_buckets: int) -> list[tuple[list[int], np.ndarray]]:
    """The buckets `ids` fall in, split into tasks of about `IDS_PER_TASK` ids each."""
    ids = np.unique(ids)
    if not len(ids):
        return []
    bucket = ids % num_buckets
    touched = np.unique(bucket)
    tasks = min(len(touched), math.ceil(len(ids) / IDS_PER_TASK))
    out = []
    for g in range(tasks):
        ks = touched[g::tasks]
        out.append(([int(k) for k in ks], ids[np.isin(bucket, ks)]))
    return out


def ids_of(*arrays: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """The distinct int64 ids of several id columns."""
    parts = [np.asarray(pc.drop_null(a) if not isinstance(a, np.ndarray) else a) for a in arrays]
    return np.unique(np.concatenate([p.astype(np.int64) for p in parts] or [np.empty(0, np.int64)]))


def isin(column: pa.Array | pa.ChunkedArray, ids: np.ndarray) -> pa.ChunkedArray | pa.Array:
    return pc.is_in(column, value_set=pa.array(ids, pa.int64()))


def changed_venues(old: pa.Table, new: pa.Table) -> list[str]:
    """Venues whose top-venue row (in the top share or not, field, domain) differs."""

    def rows(t: pa.Table) -> set[tuple[Any, ...]]:
        return set(zip(*(t[c].to_pylist() for c in TOP_ROW)))

    return sorted({r[0] for r in rows(old) ^ rows(new)})


@dataclass(frozen=True)
class Dirty:
    """Pass A, a group of citing buckets: the dirty papers' eligible rows (uncapped) and their
    citations from top-venue papers."""

    storage: Storage
    papers: BucketPlan
    citations: BucketPlan
    top: pa.Table
    mining: MiningConfig
    tasks: list[tuple[list[int], np.ndarray]]

    def __call__(self, g: int) -> tuple[pa.Table, pa.Table]:
        ks, ids = self.tasks[g]
        papers = read_ids(self.papers, self.storage, ks, "corpus_id", ids, full.PAPER_COLUMNS)
        citations = read_ids(
            self.citations,
            self.storage,
            ks,
            "citing_id",
            ids,
            ["citing_id", "cited_id", "context_source"],
        )
        with_context = citations.filter(rules.has_citing_sentence(citations)).select(["citing_id"])
        eligible = rules.eligible_base_papers(
            papers, self.top, with_context, **rules.eligibility(self.mining)
        )
        top_cites = duck.query(
            full.TOP_CITES_SQL,
            citations=citations.select(["citing_id", "cited_id"]),
            papers=papers.select(["corpus_id", "venue_id"]),
            top=self.top.select(["venue_id"]),
        ).cast(TOP_CITES_SCHEMA)
        return eligible, top_cites


@dataclass(frozen=True)
class Candidates:
    """Pass B, a group of citing buckets: the citations of base papers to read again (dirty or
    newly drawn), with the base side attached, as a build's pass 2 computes them."""

    storage: Storage
    citations: BucketPlan
    base: pa.Table
    tasks: list[tuple[list[int], np.ndarray]]

    def __call__(self, g: int) -> pa.Table:
        ks, ids = self.tasks[g]
        columns = [*full.CANDIDATE_COLUMNS, "is_influential"]
        citations = read_ids(self.citations, self.storage, ks, "citing_id", ids, columns)
        base = self.base.filter(isin(self.base["corpus_id"], ids))
        n = self.citations.layout.num_buckets
        found = duck.query(full.CANDIDATE_SQL.format(n=n), citations=citations, base=base)
        return found.drop_columns([BUCKET])


@dataclass(frozen=True)
class PairsAndUniverse:
    """Pass C, a group of cited buckets: the pairs of the candidates to recompute, and the
    universe rows of the papers whose membership or row may have changed (`universe_ids`),
    each bucket's part of the universe rewritten from its kept part."""

    storage: Storage
    papers: BucketPlan
    top: pa.Table
    candidates: pa.Table  # to recompute, citing papers of these buckets
    universe_ids: np.ndarray  # to recompute
    top_cited: np.ndarray  # the ones of them a top-venue paper cites
    old_universe: str
    new_universe: str
    tasks: list[tuple[list[int], np.ndarray]]

    def __call__(self, g: int) -> tuple[pa.Table, dict[int, int]]:
        ks, ids = self.tasks[g]
        n = self.papers.layout.num_buckets
        papers = read_ids(self.papers, self.storage, ks, "corpus_id", ids, full.PAPER_COLUMNS)
        candidates = self.candidates.filter(isin(self.candidates["cited_id"], ids))
        pairs = rules.cross_topic_pairs(candidates, papers)
        members = papers.filter(isin(papers["corpus_id"], self.universe_ids))
        member_ids = duck.query(
            """SELECT p.corpus_id AS id FROM papers p JOIN top t ON t.venue_id = p.venue_id
               UNION ALL SELECT id FROM cited""",
            papers=members.select(["corpus_id", "venue_id"]),
            top=self.top.select(["venue_id"]),
            cited=pa.table({"id": pa.array(self.top_cited, pa.int64())}),
        )
        fresh = duck.query(
            full.UNIVERSE_SQL, papers=members, ids=member_ids, top=self.top.select(["venue_id"])
        ).cast(full.UNIVERSE_SCHEMA)
        rows = {}
        for k in ks:
            part = f"part-{k:05d}.parquet"
            kept = self.storage.read_parquet(join(self.old_universe, part)).cast(
                full.UNIVERSE_SCHEMA
            )
            kept = kept.filter(pc.invert(isin(kept["corpus_id"], self.universe_ids)))
            mine = fresh.filter(pc.equal(pc.remainder(fresh["corpus_id"], n), k))
            table = pa.concat_tables([kept, mine]).sort_by("corpus_id")
            self.storage.write_parquet(table, join(self.new_universe, part))
            rows[k] = table.num_rows
        return pairs, rows


@dataclass(frozen=True)
class Mined:
    """What either path of the stage computed, for it to publish: the drawn base papers and
    the per-field report, every cross-topic pair (before the citing-sentence filter), the
    universe's row count and what the path says about itself (`stats["incremental"]`)."""

    base: pa.Table
    report: pa.Table
    pairs_all: pa.Table
    universe_rows: int
    said: dict[str, Any]


def write_state(storage: Storage, uri: str, tables: dict[str, pa.Table], num_buckets: int) -> None:
    """Kept tables as one part each (`candidates` in the buckets of its cited papers, as a
    build's pass 2 writes them)."""
    for name, table in tables.items():
        if name == "candidates":
            bucket = pc.cast(pc.remainder(table["cited_id"], num_buckets), pa.int32())
            buckets.write_partitions(
                table.append_column(BUCKET, bucket), join(uri, name), storage, "refresh"
            )
            storage.make_dirs(join(uri, name))  # an empty table writes no folder
        else:
            storage.write_parquet(table, join(uri, name, "part-00000.parquet"))


def _without(table: pa.Table, column: str, ids: np.ndarray) -> pa.Table:
    return table.filter(pc.invert(isin(table[column], ids)))


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])


def mine(
    storage: Storage,
    m: MiningConfig,
    papers: BucketPlan,
    citations: BucketPlan,
    top: pa.Table,
    kept: Kept,
    out: str,
    cpus: float,
    phase: Phases,
) -> Mined:
    """The refresh's mine: the kept state brought up to date for the dirty papers (module
    docstring); writes the universe parts and the new state under `out`."""
    n = papers.layout.num_buckets
    state, changes = kept.state_uri, kept.changes
    prev_tables = kept.manifest["tables"]
    with phase("base_papers"):
        venues = changed_venues(read_state(storage, state, "top_venues"), top)
        venue_papers = (
            storage.open_lance(papers.uri, papers.version).to_table(
                columns=["corpus_id"], filter=in_list("venue_id", venues)
            )["corpus_id"]
            if venues
            else pa.array([], pa.int64())
        )
        dirty = ids_of(changes.papers, changes.citing, venue_papers)
        tasks = groups(dirty, n)
        found = run_buckets(len(tasks), Dirty(storage, papers, citations, top, m, tasks), cpus)
        old_eligible = read_state(storage, state, "eligible")
        eligible = _concat(
            [_without(old_eligible, "corpus_id", dirty), *(e for e, _ in found)],
            old_eligible.schema,
        )
        capped = rules.cap_per_bucket(eligible, m.base_per_field, n)
        base, report = rules.sample_per_field(capped, m.base_per_field)

    with phase("candidates"):
        drawn = ids_of(base["corpus_id"])
        was = ids_of(
            storage.read_parquet(prev_tables["base_papers"]["uri"], ["corpus_id"])["corpus_id"]
        )
        reread = drawn[np.isin(drawn, dirty) | ~np.isin(drawn, was)]
        gone = was[np.isin(was, dirty) | ~np.isin(was, drawn)]
        redo = ids_of(reread, gone)
        tasks = groups(reread, n)
        fresh = run_buckets(len(tasks), Candidates(storage, citations, base, tasks), cpus)
        old_candidates = read_candidates(
            storage, state, candidate_schema(storage, citations, old_eligible.schema)
        )
        kept_candidates = _without(old_candidates, "base_id", redo)
        candidates = _concat([kept_candidates, *fresh], old_candidates.schema)

    with phase("pairs_universe"):
        changed = ids_of(changes.papers)
        recompute = _concat(
            [*fresh, kept_candidates.filter(isin(kept_candidates["cited_id"], changed))],
            old_candidates.schema,
        )
        old_cites = read_state(storage, state, "top_cites")
        new_cites = [c for _, c in found]
        top_cites = _concat([_without(old_cites, "citing_id", dirty), *new_cites], TOP_CITES_SCHEMA)
        universe_ids = ids_of(
            dirty,
            old_cites.filter(isin(old_cites["citing_id"], dirty))["cited_id"],
            *(c["cited_id"] for c in new_cites),
        )
        top_cited = universe_ids[np.isin(universe_ids, ids_of(top_cites["cited_id"]))]
        tasks = groups(ids_of(universe_ids, recompute["cited_id"]), n)
        universe_uri = join(out, "universe")
        old_universe = prev_tables["universe"]["uri"]
        results = run_buckets(
            len(tasks),
            PairsAndUniverse(
                storage,
                papers,
                top,
                recompute,
                universe_ids,
                top_cited,
                old_universe,
                universe_uri,
                tasks,
            ),
            cpus,
        )
        rewritten = {k: rows for _, r in results for k, rows in r.items()}
        copied = [k for k in range(n) if k not in rewritten]
        for k in copied:
            part = f"part-{k:05d}.parquet"
            copy_file(storage, join(old_universe, part), join(universe_uri, part))
        universe_rows = sum(rewritten.values()) + sum(
            storage.parquet_file(join(universe_uri, f"part-{k:05d}.parquet")).metadata.num_rows
            for k in copied
        )
        old_pairs = read_state(storage, state, "pairs_all")
        kept_pairs = _without(_without(old_pairs, "base_id", redo), "cited_id", changed)
        pairs_all = duck.query(
            "SELECT * FROM pairs ORDER BY base_id, cited_id",
            pairs=_concat([kept_pairs, *(p for p, _ in results)], rules.PAIR_SCHEMA),
        ).cast(rules.PAIR_SCHEMA)
        write_state(
            storage,
            join(out, "state"),
            {
                "eligible": eligible,
                "candidates": candidates,
                "pairs_all": pairs_all,
                "top_cites": top_cites,
                "top_venues": top,
            },
            n,
        )
    said = {
        "path": "incremental",
        "since_ingest_run": kept.manifest["inputs"][INGEST],
        "changed_papers": len(changed),
        "citing_papers_changed": len(ids_of(changes.citing)),
        "venues_crossing": len(venues),
        "papers_read": len(dirty),
        "base_papers_reread": len(reread),
        "pairs_recomputed_from": recompute.num_rows,
        "universe_papers_recomputed": len(universe_ids),
        "universe_buckets_copied": len(copied),
    }
    return Mined(base, report, pairs_all, universe_rows, said)
