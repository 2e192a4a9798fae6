"""The `pool` stage (§3.3 N1): each positive's query → three topic groups of candidates published
before q, each filled with q's rejected citations, then the round-robin merge of the poolers'
ranked lists for that group.

Phases (their seconds are in the stats). No step holds the whole universe, the driver least:
it reads the queries, the judged pairs and counts, and the universe is cut into shards of about
``pooling.shard_vectors`` papers (`shards`), each task and actor asking Ray for its shard's memory.

- **prepare**: the queries (score-positives' positives, with dates and topics from ingest's
  papers); the universe's texts (one task per key bucket: mine's universe part × ingest's
  papers of that bucket) written as the run's ``docs``, one folder per shard; the rejected
  citations (judge-analogy's judged pairs, with the dates and topics the tasks hand back).
- **encode**: per encoding pooler, the texts of each shard its embedding store lacks (a task
  per shard), encoded on a Ray Data actor pool or in one task (`embeddings.encode_missing`),
  with the query texts a dense pooler's query store lacks (`query_vectors`).
- **reuse**: with ``refresh.incremental``, what the dense poolers reuse of the last run's kept
  lists (`kept_lists`): the universe's papers removed and added since (a task per shard), the
  queries that keep their lists, the added papers' own lists; the others search in full.
- **index**: per encoding pooler (a reusing dense pooler only if a query searches in full),
  the store's rows copied to their shards (a task per store part), then each shard's vectors
  in search order (a task per shard). BM25's index is built
  where a search actor loads a shard, from the collection's statistics that the prepare bucket
  tasks counted (documents, total length, the queries' terms' document frequencies).
- **search**: per pooler, search actors that hold one shard at a time turn blocks of queries
  into per-group ranked lists, merged across shards as exactly one index ranks them
  (`poolers.PoolerSearch`, `shards.merge_hits`).
- **merge**: the fill order (`rules.round_robin`, DuckDB). Queries left with a group shorter than
  ``min_group_size`` that a deeper list can grow (`rules.deeper_queries`) are searched again at
  ``top_k_short`` (search_short, merge_short).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from math import ceil
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from cpr_ray.config import PoolingConfig
from cpr_ray.corpus.tables import PinnedTable, bucket_plan, papers_by_id
from cpr_ray.errors import StorageError
from cpr_ray.pooling.embeddings import (
    assemble_index,
    encode_missing,
    key_column,
    missing_texts,
    route_part,
    store_parts,
    with_keys,
)
from cpr_ray.pooling.kept_lists import (
    losing_queries,
    of_queries,
    shard_delta,
    unchanged_queries,
)
from cpr_ray.pooling.pool_rules import (
    build_queries,
    deeper_queries,
    doc_text,
    group_sizes,
    rejected_citations,
    round_robin,
    topic_ids,
    universe_docs,
)
from cpr_ray.pooling.pool_schemas import CANDIDATES, GROUPS, REJECTED, SHARD_HITS
from cpr_ray.pooling.poolers import PoolerPlan, PoolerSearch, plans
from cpr_ray.pooling.query_vectors import missing_queries
from cpr_ray.pooling.universe_shards import (
    BM25_BYTES,
    DOC_BYTES,
    SEARCH_BASE,
    MiB,
    bytes_memory,
    index_memory,
    merge_hits,
    shard_count,
    shard_of,
)
from cpr_ray.retrieval.bm25 import BM25Retriever, CollectionStats
from cpr_ray.retrieval.faiss_index import factory_for
from cpr_ray.retrieval.model_source import locate
from cpr_ray.runs.stage_runner import (
    Manifest,
    Phases,
    Reads,
    StageOutput,
    StageRun,
    console,
    entry,
    read_manifest,
)
from cpr_ray.stages import INGEST, JUDGE_ANALOGY, MINE, POOL, SCORE_POSITIVES
from cpr_ray.storage.store import Storage, StorageConfig, join
from cpr_ray.tables.buckets import BucketPlan, read_lance_bucket, run_buckets

PAPER_COLUMNS = ["corpus_id", "title", "abstract", "publication_date", "year", "topics"]
SEARCH_PHASES = ("search", "merge", "search_short", "merge_short")
STATS_ROWS = 8192  # texts a bucket task tokenizes at once for BM25's statistics

FLAT = 1 << 62  # pooling.ivf_min_docs of an index that must be exact: the added papers'
KEPT = "kept"  # the run folder's lists for the next run (`_keep`, `kept_lists`)

_missing = ray.remote(missing_texts)
_delta = ray.remote(shard_delta)
_route = ray.remote(route_part)
_assemble = ray.remote(assemble_index)


@dataclass(frozen=True)
class Shard:
    """What one search actor loads at a time: papers (DOCS folders), their index (BM25: the
    universe's statistics to index them with), the memory it asks."""

    docs: list[str]
    index: str | None
    memory: int


def paper_meta(storage: Storage, papers: PinnedTable, ids: pa.Array) -> pa.Table:
    """Dates and topic ids of the given papers (a bounded id list, pushed down to Lance)."""
    t = papers_by_id(storage, papers, ids, ["publication_date", "year", "topics"])
    return t.drop_columns(["topics"]).append_column("topic_ids", topic_ids(t["topics"]))


def _keyed_docs(papers: pa.Table, universe_ids: pa.Array, templates: list[str]) -> pa.Table:
    return with_keys(universe_docs(papers, universe_ids), templates)


@dataclass(frozen=True)
class _DocsOfBucket:
    """A bucket task of `snapshot_docs`: bucket k's universe papers as DOCS rows, written to
    their shards' folders; returns the papers per shard, the universe ids read, the
    `wanted` papers' (corpus_id, date_key, topic_ids) and, per `lexical` template, the
    bucket's part of BM25's collection statistics over the queries' `terms`."""

    storage: Storage
    plan: BucketPlan
    universe_uri: str
    docs_uri: str
    templates: list[str]
    shards: int
    wanted: pa.Array
    lexical: list[str]
    terms: list[str]

    def __call__(self, k: int) -> tuple[np.ndarray, int, pa.Table, list[CollectionStats]]:
        part = join(self.universe_uri, f"part-{k:05d}.parquet")
        ids = self.storage.read_parquet(part, ["corpus_id"])["corpus_id"].combine_chunks()
        papers = read_lance_bucket(self.plan, self.storage, k, PAPER_COLUMNS)
        docs = _keyed_docs(papers, ids, self.templates)
        shard = shard_of(docs["corpus_id"].to_numpy(), self.shards)
        counts = np.bincount(shard, minlength=self.shards)
        for s in np.flatnonzero(counts):  # a retried task rewrites its own parts
            out = join(self.docs_uri, f"shard-{s:05d}", f"part-{k:05d}.parquet")
            self.storage.write_parquet(docs.filter(pa.array(shard == s)), out)
        meta = docs.filter(pc.is_in(docs["corpus_id"], value_set=self.wanted))
        stats = [self._statistics(docs, t) for t in self.lexical]
        return counts, len(ids), meta.select(["corpus_id", "date_key", "topic_ids"]), stats

    def _statistics(self, docs: pa.Table, template: str) -> CollectionStats:
        """The bucket's part of BM25's statistics, counted a slice of texts at a time (their
        tokens as Python lists weigh more than the Arrow rows the task asks memory for)."""
        texts, bm25 = doc_text(docs["title"], docs["abstract"], template), BM25Retriever()
        return CollectionStats.total(
            bm25.statistics(texts.slice(s, STATS_ROWS).to_pylist(), self.terms)
            for s in range(0, len(texts), STATS_ROWS)
        )


@dataclass(frozen=True)
class Snapshot:
    """The universe's DOCS rows as the bucket tasks wrote them, per shard."""

    shards: dict[int, str]  # shard -> its DOCS folder, the shards holding papers only
    counts: np.ndarray  # (shards,) papers per shard
    universe: int  # papers of mine's universe, those without abstract or date included
    meta: pa.Table  # (corpus_id, date_key, topic_ids) of the `wanted` papers in it
    lexical: dict[str, CollectionStats]  # BM25's statistics of the universe, per template

    @property
    def documents(self) -> int:
        return int(self.counts.sum())


def snapshot_docs(
    storage: Storage,
    plan: BucketPlan,
    universe_uri: str,
    docs_uri: str,
    templates: list[str],
    shards: int,
    wanted: pa.Array,
    lexical: list[str],
    terms: list[str],
) -> Snapshot:
    """The universe's DOCS rows under `docs_uri`, with their content key under each document
    template, one folder per shard: one plain task per key bucket of the papers (asking Ray for
    a bucket's rows), each reading its bucket of mine's universe (the same key buckets), so
    neither the driver nor a task holds the whole universe. The tasks hand back their counts,
    the few `wanted` papers' dates and topics, and per BM25 template in `lexical` their part of
    the collection's statistics, the document frequencies of the queries' `terms` only (so
    the driver sums tables bounded by the queries). (A Ray Data scan of the table cost ~6 s
    to start, more than the scan itself on a refresh's or a dry run's corpus.)"""
    fn = _DocsOfBucket(
        storage, plan, universe_uri, docs_uri, templates, shards, wanted, lexical, terms
    )
    buckets = plan.layout.num_buckets
    found = run_buckets(buckets, fn, 1, index_memory(ceil(plan.rows / buckets), DOC_BYTES))
    counts = np.sum([f[0] for f in found], axis=0, dtype=np.int64).reshape(shards)
    folders = {int(s): join(docs_uri, f"shard-{s:05d}") for s in np.flatnonzero(counts)}
    meta = pa.concat_tables([f[2] for f in found])
    stats = {t: CollectionStats.total(f[3][i] for f in found) for i, t in enumerate(lexical)}
    return Snapshot(folders, counts, sum(f[1] for f in found), meta, stats)


def universe_rows(storage: Storage, universe_uri: str) -> int:
    """Papers in mine's universe, from its parts' footers (the driver reads no row of it)."""
    files = storage.list_files(universe_uri, (".parquet",))
    return sum(
        storage.parquet_file(join(universe_uri, f.base_name)).metadata.num_rows for f in files
    )


def search_shard(
    plan: PoolerPlan, storage: StorageConfig, shard: Shard, queries: pa.Table, step: int
) -> pa.Table:
    """One shard's lists (SHARD_HITS) for every query of `queries`, `step` queries a call, in a
    plain task (`_search` with ``tasks``)."""
    search = PoolerSearch(plan, storage, shard.docs, shard.index)
    parts = [search(queries.slice(s, step)) for s in range(0, queries.num_rows, step)]
    return pa.concat_tables([SHARD_HITS.empty_table(), *parts])


def _search(
    run: StageRun,
    pool_plans: list[PoolerPlan],
    queries: pa.Table,
    shards: dict[str, list[Shard]],
    *,
    tasks: bool = False,
) -> pa.Table:
    """Every pooler's lists (SHARD_HITS) for the SEARCH_QUERIES rows in `queries`: per pooler,
    search actors (at most ``pooling.search_actors``) each holding one shard at a time; every
    block of queries is searched in every shard and the shards' lists merged
    (`shards.merge_hits`) as they come back, so the driver holds the merged lists only. One
    pooler after another: actors holding every CPU would starve the other's. With `tasks`
    (a dense pooler's few queries, or a refresh's few added papers) each shard is searched by
    a plain task instead (`search_shard`): a warm worker, where an actor starts a process."""
    cfg = run.cfg.pooling
    step = cfg.search_batch
    tables = [queries.slice(s, step) for s in range(0, queries.num_rows, step)]
    blocks = [ray.put(t) for t in tables]
    depths = [t.select(["query_id", "depth"]) for t in tables]

    def in_tasks(plan: PoolerPlan, parts: list[Shard]) -> pa.Table:
        task = ray.remote(search_shard)
        refs = [
            task.options(memory=p.memory, **plan.pool.ray_resources()).remote(
                plan, run.storage.cfg, p, queries, step
            )
            for p in parts
        ]
        return merge_hits([ray.get(r) for r in refs], queries.select(["query_id", "depth"]))

    def search(plan: PoolerPlan, parts: list[Shard]) -> pa.Table:
        if tasks:
            return in_tasks(plan, parts)
        started = time.perf_counter()
        n = min(cfg.search_actors, len(parts))
        actor = ray.remote(PoolerSearch).options(
            memory=max(p.memory for p in parts), **plan.pool.ray_resources()
        )
        # Any: Ray types a handle as `ActorHandle[T] | type[T]`, whose methods lack `.remote`
        actors: list[Any] = [
            actor.remote(plan, run.storage.cfg, parts[a].docs, parts[a].index) for a in range(n)
        ]
        try:
            refs = []
            for s, part in enumerate(parts):  # an actor's calls run in order: load, then search
                held = actors[s % n]
                if s >= n:
                    held.load.remote(part.docs, part.index)
                refs.append([held.search.remote(b) for b in blocks])
            merged = [SHARD_HITS.empty_table()] * len(blocks)
            first = 0.0
            for shard_refs in refs:
                for i, ref in enumerate(shard_refs):
                    merged[i] = merge_hits([merged[i], ray.get(ref)], depths[i])
                    shard_refs[i] = None  # its lists are merged: free them
                    first = first or time.perf_counter() - started
        finally:
            for a in actors:
                ray.kill(a)
        console.print(
            f"  pool: {plan.name} searched in {len(parts)} shard(s) by {n} actor(s) in "
            f"{time.perf_counter() - started:.1f} s (first shard's lists after {first:.1f} s)"
        )
        return pa.concat_tables(merged) if merged else SHARD_HITS.empty_table()

    if queries.num_rows == 0:
        return SHARD_HITS.empty_table()
    parts = [search(plan, shards[plan.name]) for plan in pool_plans if shards[plan.name]]
    return pa.concat_tables(parts) if parts else SHARD_HITS.empty_table()


def _indexes(
    run: StageRun, encoding: list[PoolerPlan], snap: Snapshot, shards: int
) -> tuple[dict[str, list[Shard]], dict[str, dict[str, Any]]]:
    """Each encoding pooler's index, one per shard (`embeddings.assemble_index`), from the
    store's rows copied to their shards' folders first (`embeddings.route_part`, once per
    store); returns each pooler's shards and its index's figures."""
    cfg, storage = run.cfg.pooling, run.storage
    routed: dict[str, tuple[str, np.ndarray]] = {}
    for plan in encoding:
        if plan.store_key in routed:
            continue
        folder = join(run.out, "_work", "vectors", plan.store_key)
        routes = [
            _route.options(memory=bytes_memory(size)).remote(
                storage.cfg, plan.kind, uri, folder, shards
            )
            for uri, size in store_parts(storage, plan)
        ]
        routed[plan.store_key] = (folder, sum(ray.get(routes), np.zeros((shards, 2), np.int64)))
    refs: dict[tuple[str, int], ray.ObjectRef] = {}
    bytes_per_doc: dict[str, float] = {}
    for plan in encoding:
        vectors, sizes = routed[plan.store_key]
        bytes_per_doc[plan.name] = sizes[:, 1].sum() / max(1, sizes[:, 0].sum())
        for s, docs in snap.shards.items():
            memory = index_memory(int(sizes[s, 0]), bytes_per_doc[plan.name])
            refs[plan.name, s] = _assemble.options(memory=memory).remote(
                storage.cfg,
                plan,
                docs,
                join(vectors, f"shard-{s:05d}"),
                join(run.out, "index", plan.name, f"shard-{s:05d}"),
                cfg.ivf_min_docs,
                cfg.ivf_lists,
                cfg.ivf_nprobe,
            )
    built = {key: ray.get(ref) for key, ref in refs.items()}
    for vectors, _ in routed.values():
        storage.delete_dir(vectors)
    out: dict[str, list[Shard]] = {}
    figures: dict[str, dict[str, Any]] = {}
    for plan in encoding:
        mine = [built[plan.name, s] for s in snap.shards]
        memory = index_memory(int(snap.counts.max()), bytes_per_doc[plan.name], SEARCH_BASE)
        out[plan.name] = [
            Shard([docs], join(run.out, "index", plan.name, f"shard-{s:05d}"), memory)
            for s, docs in snap.shards.items()
        ]
        documents = sum(int(b["documents"]) for b in mine)
        first = mine[0] if mine else {}
        fig: dict[str, Any] = {"index": first.get("index"), "documents": documents}
        fig["shards"] = len(mine)
        if plan.kind == "dense":
            fig["dim"] = first.get("dim")
        else:
            nonzeros = sum(b["nonzeros"] for b in mine)
            fig["nonzeros_per_doc"] = round(nonzeros / max(1, documents), 1)
        fig["search_actor_memory_mib"] = memory // MiB
        figures[plan.name] = fig
    return out, figures


def _bm25_shards(run: StageRun, plan: PoolerPlan, snap: Snapshot) -> list[Shard]:
    """A BM25 pooler's shards: each shard's papers, indexed where a search actor loads them
    with the universe's statistics (written once as the shards' "index", a file bounded by the
    queries' terms), so that each shard scores its papers as one index over the universe."""
    uri = join(run.out, "index", plan.name, "collection.json")
    run.storage.write_json(uri, snap.lexical[plan.template].as_dict())
    memory = index_memory(int(snap.counts.max()), BM25_BYTES)
    return [Shard([docs], uri, memory) for docs in snap.shards.values()]


@dataclass(frozen=True)
class Reuse:
    """What a run reuses of the last run's dense lists (`kept_lists`)."""

    hits: pa.Table  # kept SHARD_HITS at top_k of the queries that keep their lists
    short: pa.Table  # kept SHARD_HITS at top_k_short of those pooled deeper last time
    added: pa.Table  # SHARD_HITS of the added papers alone for those queries, at the deeper depth
    keep: pa.Array  # the query ids that keep their lists
    removed: int  # papers removed from the universe or changed
    added_papers: int  # papers added to it or changed


def _flat(cfg: PoolingConfig, snap: Snapshot) -> bool:
    """Whether every shard's dense index is exact (flat): an IVF index's lists are not."""
    return factory_for(int(snap.counts.max(initial=0)), cfg.ivf_min_docs, cfg.ivf_lists) == "Flat"


def _no_reuse(run: StageRun, snap: Snapshot, shards: int) -> tuple[Manifest | None, str | None]:
    """The last published run of pool, and why its kept lists cannot be reused (None: they can)."""
    if not run.cfg.refresh.incremental:
        return None, "refresh.incremental is false"
    prev = read_manifest(run.storage, POOL)
    kept = prev.get("stats", {}).get("kept") if prev else None
    if prev is None or not prev.get("complete", True) or not kept:
        return None, "no run kept its lists"
    if kept.get("fingerprint") != run.cfg.section_hash("pooling"):
        return None, f"the pooling config changed since run {prev['run_id']}"
    if kept.get("shards") != shards:
        return None, "the universe's shard count changed"
    if not (kept.get("flat") and _flat(run.cfg.pooling, snap)):
        return None, "an IVF index's lists are approximate (pooling.ivf_min_docs)"
    return prev, None


def _reuse(
    run: StageRun, snap: Snapshot, shards: int, search: pa.Table, dense: list[PoolerPlan]
) -> tuple[Reuse | None, str | None]:
    """What the dense poolers reuse of the last run's lists, or why nothing (said in one line):
    the universe's papers removed and added since (a task per shard, `kept_lists.shard_delta`),
    the queries that keep their lists, and the added papers' own lists for those."""
    if not dense:
        return None, None
    prev, why = _no_reuse(run, snap, shards)
    if prev is not None:
        try:
            return _reused(run, prev, snap, search, dense), None
        except StorageError as exc:  # a kept file gone or unreadable
            why = f"its kept lists cannot be read ({exc})"
    console.print(f"  pool: dense poolers search every query in full: {why}")
    return None, why


def _reused(
    run: StageRun, prev: Manifest, snap: Snapshot, search: pa.Table, dense: list[PoolerPlan]
) -> Reuse:
    storage, cfg = run.storage, run.cfg.pooling
    folder, kept = join(prev["output"], KEPT), prev["stats"]["kept"]
    searched = storage.read_parquet(join(folder, "searched.parquet"))
    hits = storage.read_parquet(join(folder, "hits.parquet"))
    short = storage.read_parquet(join(folder, "short.parquet"))
    columns = ["date_key", "topic_ids", *sorted({key_column(p.template) for p in dense})]
    added_uri, before = join(run.out, "_work", "added"), set(kept["docs_shards"])
    refs = [
        _delta.options(memory=index_memory(int(snap.counts.max()), DOC_BYTES)).remote(
            storage.cfg,
            join(prev["output"], "docs", f"shard-{s:05d}") if s in before else None,
            snap.shards.get(s),
            columns,
            join(added_uri, f"shard-{s:05d}.parquet"),
        )
        for s in sorted(before | set(snap.shards))
    ]
    found = ray.get(refs)
    removed = np.concatenate([np.zeros(0, np.int64), *(f[0] for f in found)])
    added = sum(f[1] for f in found)
    lost = losing_queries(pa.concat_tables([hits, short]), removed)
    unchanged = unchanged_queries(search, searched)
    keep = unchanged.filter(pc.invert(pc.is_in(unchanged, value_set=lost)))
    deep = of_queries(search, keep)
    deep = deep.set_column(
        deep.schema.get_field_index("depth"),
        "depth",
        pa.array([max(cfg.top_k, cfg.top_k_short)] * deep.num_rows, pa.int32()),
    )
    own = SHARD_HITS.empty_table()
    if added and deep.num_rows:  # the added papers' lists, searched once at the deeper depth
        index = {
            p.name: _assemble.remote(
                storage.cfg, p, added_uri, None, join(run.out, "index-added", p.name), FLAT, None, 1
            )
            for p in dense
        }
        parts = {}
        for p in dense:
            dim = cast(int, ray.get(index[p.name])["dim"])  # a dense index's figures
            memory = index_memory(added, dim * 4, SEARCH_BASE)
            parts[p.name] = [Shard([added_uri], join(run.out, "index-added", p.name), memory)]
        own = _search(run, dense, deep, parts, tasks=True)
    console.print(
        f"  pool: dense poolers reuse the lists of {len(keep):,} of {search.num_rows:,} queries "
        f"(run {prev['run_id']}); {added:,} papers added or changed, {len(removed):,} removed "
        "or changed"
    )
    return Reuse(of_queries(hits, keep), of_queries(short, keep), own, keep, len(removed), added)


def _reused_search(
    run: StageRun,
    reuse: Reuse,
    dense: list[PoolerPlan],
    queries: pa.Table,
    full_index: Callable[[], dict[str, list[Shard]]],
    *,
    short: bool,
) -> list[pa.Table]:
    """The dense poolers' lists for a pass's `queries`: a query that keeps its lists (and, pooled
    deeper, kept a deeper one) merges them with the added papers' (`merge_hits`, per pooler);
    the others are searched in full."""
    kept = reuse.short if short else reuse.hits
    ids = reuse.keep
    if short:
        ids = ids.filter(pc.is_in(ids, value_set=pc.unique(kept["query_id"])))
    mine = of_queries(queries, ids)
    rest = queries.filter(pc.invert(pc.is_in(queries["query_id"], value_set=ids)))
    few = rest.num_rows <= run.cfg.pooling.search_batch  # one block: no actor to start
    out = [_search(run, dense, rest, full_index(), tasks=few)] if rest.num_rows else []
    if mine.num_rows:
        depths, added = mine.select(["query_id", "depth"]), of_queries(reuse.added, ids)
        for p in dense:
            parts = [
                t.filter(pc.equal(t["pooler"], p.name)) for t in (of_queries(kept, ids), added)
            ]
            out.append(merge_hits(parts, depths))
    return out


def _keep(
    run: StageRun,
    search: pa.Table,
    dense: list[PoolerPlan],
    hits: pa.Table,
    hits_short: pa.Table,
    snap: Snapshot,
    shards: int,
) -> dict[str, Any] | None:
    """Keep the dense poolers' lists (with their scores) and the queries they were searched for
    in this run's folder, for the next run to reuse (`_reuse`)."""
    if not dense:
        return None
    folder, names = join(run.out, KEPT), pa.array([p.name for p in dense])
    run.storage.write_parquet(search, join(folder, "searched.parquet"))
    for name, table in (("hits", hits), ("short", hits_short)):
        table = table.filter(pc.is_in(table["pooler"], value_set=names))
        run.storage.write_parquet(table, join(folder, f"{name}.parquet"))
    return {
        "fingerprint": run.cfg.section_hash("pooling"),
        "shards": shards,
        "docs_shards": sorted(snap.shards),
        "flat": _flat(run.cfg.pooling, snap),
    }


def _reuse_stats(reuse: Reuse | None, why: str | None) -> dict[str, Any]:
    if reuse is None:
        return {"reused": False, "why": why}
    return {
        "reused": True,
        "queries_kept": len(reuse.keep),
        "papers_added": reuse.added_papers,
        "papers_removed": reuse.removed,
    }


def _pool(
    run: StageRun,
    positives_uri: str,
    judged_uri: str,
    universe_uri: str,
    papers: PinnedTable,
    papers_plan: BucketPlan,
) -> StageOutput:
    cfg, storage, phase = run.cfg.pooling, run.storage, Phases()
    pool_plans = plans(cfg)
    for plan in pool_plans:  # a wrong model name fails now, not in an encoder or search actor
        if plan.spec is not None:
            locate(plan.spec)
    names = [p.name for p in pool_plans]
    docs_uri = join(run.out, "docs")
    with phase("prepare"):
        positives = storage.read_parquet(positives_uri)
        ids = pa.concat_arrays(
            [positives["base_id"].combine_chunks(), positives["cited_id"].combine_chunks()]
        )
        queries, search = build_queries(positives, paper_meta(storage, papers, ids), cfg.top_k)
        if queries.num_rows:
            templates = [p.template for p in pool_plans if p.spec is not None]
            lexical = sorted({p.template for p in pool_plans if p.kind == "bm25"})
            terms = BM25Retriever().terms(search["query"].to_pylist()) if lexical else []
            judged = storage.read_parquet(judged_uri, ["base_id", "cited_id", "status", "decision"])
            no = pc.and_(
                pc.equal(judged["status"], "ok"), pc.equal(judged["decision"], "not_analogy")
            )
            wanted = pc.unique(judged.filter(no)["cited_id"])
            shards = shard_count(universe_rows(storage, universe_uri), cfg.shard_vectors)
            snap = snapshot_docs(
                storage,
                papers_plan,
                universe_uri,
                docs_uri,
                templates,
                shards,
                wanted.cast(pa.int64()),
                lexical,
                terms,
            )
            rejected = rejected_citations(judged, search, snap.meta)
    if queries.num_rows == 0:
        console.print("  pool: score-positives published no positives; nothing to pool")
        return _publish(run, queries, CANDIDATES.empty_table(), {"queries": 0}, phase)

    poolers: dict[str, dict[str, Any]] = {p.name: {"kind": p.kind} for p in pool_plans}
    encoding = [p for p in pool_plans if p.spec is not None]
    with phase("encode"):
        done: set[tuple[str, str]] = set()
        for plan in encoding:
            todo, todo_uri = 0, join(run.out, "_work", "todo", plan.name)
            first = (plan.store_key, plan.template) not in done
            if first:  # poolers sharing a store and a template share its documents' vectors
                done.add((plan.store_key, plan.template))
                refs = [
                    _missing.options(memory=index_memory(int(snap.counts[s]), DOC_BYTES)).remote(
                        storage.cfg, plan, docs, join(todo_uri, f"shard-{s:05d}.parquet")
                    )
                    for s, docs in snap.shards.items()
                ]
                todo = sum(ray.get(refs))
                poolers[plan.name].update(encoded=todo, reused=snap.documents - todo)
            asked = None
            if plan.kind == "dense":  # its search actors read query vectors from the store
                assert plan.spec is not None, f"{plan.name}: a dense pooler encodes"
                asked = missing_queries(storage, plan.spec, search["query"].combine_chunks())
                poolers[plan.name]["queries_encoded"] = asked.num_rows
            if todo or (asked is not None and asked.num_rows):
                encode_missing(storage, plan, todo_uri, todo, cfg.encode_batch_rows, asked)
    dense = [p for p in pool_plans if p.kind == "dense"]
    with phase("reuse"):
        reuse, why = _reuse(run, snap, shards, search, dense)
    growing = [p for p in pool_plans if reuse is None or p.kind != "dense"]
    with phase("index"):
        shard_plans, figures = _indexes(run, [p for p in encoding if p in growing], snap, shards)
        for plan in pool_plans:
            if plan.kind == "bm25" and snap.shards:
                shard_plans[plan.name] = _bm25_shards(run, plan, snap)
                figures[plan.name] = dict(
                    documents=snap.documents,
                    shards=len(snap.shards),
                    search_actor_memory_mib=shard_plans[plan.name][0].memory // MiB,
                )
            shard_plans.setdefault(plan.name, [])

    def full_index() -> dict[str, list[Shard]]:
        """The dense poolers' shards too (a reusing run builds them only to search a query in
        full)."""
        missing = [p for p in dense if not shard_plans[p.name]]
        if missing:
            built, more = _indexes(run, missing, snap, shards)
            shard_plans.update(built)
            figures.update(more)
        return shard_plans

    with phase("search"):
        if reuse is None:
            hits = _search(run, pool_plans, search, shard_plans)
        else:
            hits = pa.concat_tables(
                [
                    _search(run, growing, search, shard_plans),
                    *_reused_search(run, reuse, dense, search, full_index, short=False),
                ]
            )
    with phase("merge"):
        candidates = round_robin(hits, rejected, names, search.select(["query_id", "depth"]))
        sizes = group_sizes(candidates, queries["query_id"])
    deeper = pa.array([], pa.string())
    if cfg.top_k_short > cfg.top_k:
        deeper = deeper_queries(sizes, hits, cfg.min_group_size, cfg.top_k)
    hits_short = SHARD_HITS.empty_table()
    if len(deeper):
        again = search.filter(pc.is_in(search["query_id"], value_set=deeper))
        again = again.set_column(
            again.schema.get_field_index("depth"),
            "depth",
            pa.array([cfg.top_k_short] * again.num_rows, pa.int32()),
        )
        with phase("search_short"):
            if reuse is None:
                hits_short = _search(run, pool_plans, again, shard_plans)
            else:
                hits_short = pa.concat_tables(
                    [
                        _search(run, growing, again, shard_plans),
                        *_reused_search(run, reuse, dense, again, full_index, short=True),
                    ]
                )
        with phase("merge_short"):
            kept = candidates.filter(pc.invert(pc.is_in(candidates["query_id"], value_set=deeper)))
            redone = round_robin(hits_short, rejected, names, again.select(["query_id", "depth"]))
            candidates = pa.concat_tables([kept, redone]).sort_by("query_id")  # stable sort
            sizes = group_sizes(candidates, queries["query_id"])
    for name, fig in figures.items():
        poolers[name].update(fig)
    keeping = _keep(run, search, dense, hits, hits_short, snap, shards)
    hits = pa.concat_tables([hits, hits_short])
    for name in names:
        poolers[name]["hits"] = int(pc.sum(pc.equal(hits["pooler"], name)).as_py() or 0)

    stats = _stats(queries, candidates, sizes, cfg, phase)
    stats.update(
        universe=snap.documents,
        universe_dropped_no_abstract_or_date=snap.universe - snap.documents,
        universe_shards=len(snap.shards),
        rejected_citations=rejected.num_rows,
        queries_pooled_deeper=len(deeper),
        poolers=poolers,
        reuse=_reuse_stats(reuse, why),
    )
    if keeping is not None:
        stats["kept"] = keeping
    return _publish(run, queries, candidates, stats, phase)


def _stats(
    queries: pa.Table, candidates: pa.Table, sizes: pa.Table, cfg: PoolingConfig, phase: Phases
) -> dict[str, Any]:
    per_group = {}
    for g in GROUPS:
        n = sizes.filter(pc.equal(sizes["group"], g))["candidates"]
        per_group[g] = {
            "mean": round(pc.mean(n).as_py() or 0.0, 1),
            "min": int(pc.min(n).as_py() or 0),
            "short": int(pc.sum(pc.less(n, cfg.min_group_size)).as_py() or 0),
        }
    searched = sum(phase.seconds.get(p, 0.0) for p in SEARCH_PHASES)
    rejected = int(pc.sum(pc.equal(candidates["source"], REJECTED)).as_py() or 0)
    return {
        "queries": queries.num_rows,
        "candidates": candidates.num_rows,
        "candidates_per_group": per_group,
        "short_groups": sum(v["short"] for v in per_group.values()),
        "sources": {"rejected_citation": rejected, "pooled": candidates.num_rows - rejected},
        "queries_per_second": round(queries.num_rows / searched, 1) if searched else None,
    }


def _publish(
    run: StageRun,
    queries: pa.Table,
    candidates: pa.Table,
    stats: dict[str, Any],
    phase: Phases,
) -> StageOutput:
    queries_uri = join(run.out, "queries.parquet")
    candidates_uri = join(run.out, "candidates.parquet")
    run.storage.write_parquet(queries, queries_uri)
    run.storage.write_parquet(candidates, candidates_uri)
    stats["phase_seconds"] = phase.seconds
    if queries.num_rows:
        groups = stats["candidates_per_group"]
        means = " / ".join(f"{groups[g]['mean']:g}" for g in GROUPS)
        seconds = ", ".join(f"{k} {v:g} s" for k, v in phase.seconds.items())
        console.print(
            f"  pool: {queries.num_rows:,} queries, {candidates.num_rows:,} candidates from "
            f"{stats['universe']:,} papers; per group (query topic / positive topic / other) "
            f"mean {means}; short groups {stats['short_groups']:,} (min_group_size "
            f"{run.cfg.pooling.min_group_size}); rejected citations "
            f"{stats['sources']['rejected_citation']:,}; {seconds}"
        )
    return StageOutput(
        tables={
            "queries": {"uri": queries_uri, "format": "parquet", "rows": queries.num_rows},
            "candidates": {"uri": candidates_uri, "format": "parquet", "rows": candidates.num_rows},
        },
        stats=stats,
    )


def run_pool(run: StageRun, reads: Reads) -> StageOutput:
    """Pool candidates for score-positives' positives: judge-analogy's rejected citations
    first, then the poolers' rankings over mine's universe, at ingest's pinned papers."""
    # one read of ingest's manifest: the pinned version and the bucket plan cannot disagree
    ingest = reads[INGEST]
    return _pool(
        run,
        positives_uri=reads[SCORE_POSITIVES]["tables"]["positives"]["uri"],
        judged_uri=reads[JUDGE_ANALOGY]["tables"]["judged"]["uri"],
        universe_uri=reads[MINE]["tables"]["universe"]["uri"],
        papers=PinnedTable.of(ingest, "papers"),
        papers_plan=bucket_plan(run.storage, ingest, "papers"),
    )


# run (or skip) pool and return its manifest
pool = entry(POOL)
