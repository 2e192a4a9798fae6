"""The `pool` stage (§3.3 N1): each positive's query → three topic groups of candidates published
before q, each filled with q's rejected citations, then the round-robin merge of the poolers'
ranked lists for that group.

Phases (their seconds are in the stats):

- **prepare**: the queries (score-positives' positives, with dates and topics from ingest's
  papers); the universe's texts (mine's universe × ingest's papers, one task per key bucket of
  the papers) written as the run's ``docs``; the rejected citations (judge-analogy's judged pairs).
- **encode**: per encoding pooler, the universe texts its embedding store lacks, on a Ray Data
  actor pool (`embeddings.encode_missing`).
- **index**: per encoding pooler, this universe's vectors in search order (a Ray task each).
- **search**: per pooler, search actors turn batches of queries into per-group ranked lists
  (`poolers.PoolerSearch`, `search`).
- **merge**: the fill order (`rules.round_robin`, DuckDB). Queries left with a group shorter than
  ``min_group_size`` that a deeper list can grow (`rules.deeper_queries`) are searched again at
  ``top_k_short`` (search_short, merge_short).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from cpr_ray.buckets import BucketPlan, read_lance_bucket, run_buckets
from cpr_ray.config import Config, PoolingConfig
from cpr_ray.corpus.tables import INGEST, PinnedTable, bucket_plan, papers_by_id
from cpr_ray.pooling.embeddings import assemble_index, encode_missing, gather, with_keys
from cpr_ray.pooling.poolers import PoolerPlan, PoolerSearch, plans
from cpr_ray.pooling.rules import (
    build_queries,
    deeper_queries,
    group_sizes,
    rejected_citations,
    round_robin,
    topic_ids,
    universe_docs,
)
from cpr_ray.pooling.schemas import CANDIDATES, DOCS, GROUPS, HITS, REJECTED
from cpr_ray.retrieval.model_source import locate
from cpr_ray.stage import Phases, StageOutput, StageRun, console, require_manifest, run_stage
from cpr_ray.storage import Storage, join

STAGE = "pool"
# argument -> (stage, table) it reads
UPSTREAM = {
    "positives_uri": ("score-positives", "positives"),
    "judged_uri": ("judge-analogy", "judged"),
    "universe_uri": ("mine", "universe"),
}
PAPER_COLUMNS = ["corpus_id", "title", "abstract", "publication_date", "year", "topics"]
SEARCH_PHASES = ("search", "merge", "search_short", "merge_short")

_assemble = ray.remote(assemble_index)


def paper_meta(storage: Storage, papers: PinnedTable, ids: pa.Array) -> pa.Table:
    """Dates and topic ids of the given papers (a bounded id list, pushed down to Lance)."""
    t = papers_by_id(storage, papers, ids, ["publication_date", "year", "topics"])
    return t.drop_columns(["topics"]).append_column("topic_ids", topic_ids(t["topics"]))


def _keyed_docs(papers: pa.Table, universe_ids: pa.Array, templates: list[str]) -> pa.Table:
    return with_keys(universe_docs(papers, universe_ids), templates)


def _docs_of_bucket(
    k: int,
    *,
    storage: Storage,
    plan: BucketPlan,
    universe_ids: pa.Array,
    docs_uri: str,
    templates: list[str],
) -> None:
    docs = _keyed_docs(read_lance_bucket(plan, storage, k, PAPER_COLUMNS), universe_ids, templates)
    if docs.num_rows:  # a retried task rewrites its own part
        storage.write_parquet(docs, join(docs_uri, f"part-{k:05d}.parquet"))


def snapshot_docs(
    storage: Storage, plan: BucketPlan, universe_uri: str, docs_uri: str, templates: list[str]
) -> int:
    """The universe's DOCS rows under `docs_uri`, with their content key under each document
    template: one plain task per key bucket of the papers, each filtering its bucket against the
    (broadcast) universe ids. (A Ray Data scan of the table cost ~6 s to start, more than the
    scan itself on a refresh's or a dry run's corpus.) Returns the universe's size."""
    universe_ids = storage.read_parquet(universe_uri, ["corpus_id"])["corpus_id"].combine_chunks()
    fn = partial(
        _docs_of_bucket,
        storage=storage,
        plan=plan,
        universe_ids=universe_ids,
        docs_uri=docs_uri,
        templates=templates,
    )
    run_buckets(plan.layout.num_buckets, fn, 1)
    if not storage.exists(docs_uri) or not storage.list_files(docs_uri, (".parquet",)):
        storage.write_parquet(
            with_keys(DOCS.empty_table(), templates), join(docs_uri, "empty.parquet")
        )
    return len(universe_ids)


def _search(
    run: StageRun,
    pool_plans: list[PoolerPlan],
    queries: pa.Table,
    docs_uri: str,
    index_uris: dict[str, str],
) -> pa.Table:
    """Every pooler's HITS for the SEARCH_QUERIES rows in `queries`: one actor pool per pooler,
    one pooler after another (concurrent Ray Data executions each size themselves to the whole
    cluster: on a small one, actors holding every CPU starve the other's tasks)."""
    cfg = run.cfg.pooling
    step = cfg.search_batch
    blocks = [queries.slice(s, step) for s in range(0, queries.num_rows, step)]

    def search(plan: PoolerPlan) -> pa.Table:
        ds = ray.data.from_arrow(blocks).map_batches(
            PoolerSearch,
            fn_constructor_kwargs={
                "plan": plan,
                "storage": run.storage.cfg,
                "docs_uri": docs_uri,
                "index_uri": index_uris.get(plan.name),
            },
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=cfg.search_actors),
            batch_size=step,
            batch_format="pyarrow",
            num_cpus=plan.num_cpus,
            num_gpus=plan.num_gpus,
            **({"resources": dict(plan.resources)} if plan.resources else {}),
        )
        return gather(ds, HITS)

    parts = [search(plan) for plan in pool_plans]
    return pa.concat_tables(parts) if parts else HITS.empty_table()


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
            in_universe = snapshot_docs(storage, papers_plan, universe_uri, docs_uri, templates)
            docs = storage.read_parquet(docs_uri, ["corpus_id", "date_key", "topic_ids"])
            judged = storage.read_parquet(judged_uri, ["base_id", "cited_id", "status", "decision"])
            rejected = rejected_citations(judged, search, docs)
    if queries.num_rows == 0:
        console.print("  pool: score-positives published no positives; nothing to pool")
        return _publish(run, queries, CANDIDATES.empty_table(), {"queries": 0}, phase)

    poolers: dict[str, dict[str, Any]] = {p.name: {"kind": p.kind} for p in pool_plans}
    encoding = [p for p in pool_plans if p.spec is not None]
    keys: dict[tuple[str, str], pa.Table] = {}
    with phase("encode"):
        for plan in encoding:
            shared = (plan.store_key, plan.template)
            if shared not in keys:
                keys[shared], encoded = encode_missing(
                    storage, plan, docs_uri, cfg.encode_batch_rows
                )
                poolers[plan.name].update(encoded=encoded, reused=keys[shared].num_rows - encoded)
    index_uris = {p.name: join(run.out, "index", p.name) for p in encoding}
    with phase("index"):
        refs = {
            p.name: _assemble.options(num_cpus=1).remote(
                storage.cfg,
                p,
                docs_uri,
                index_uris[p.name],
                keys[(p.store_key, p.template)],
                cfg.ivf_min_docs,
                cfg.ivf_lists,
                cfg.ivf_nprobe,
            )
            for p in encoding
        }
        for name, ref in refs.items():
            poolers[name].update(ray.get(ref))

    with phase("search"):
        hits = _search(run, pool_plans, search, docs_uri, index_uris)
    with phase("merge"):
        candidates = round_robin(hits, rejected, names, search.select(["query_id", "depth"]))
        sizes = group_sizes(candidates, queries["query_id"])
    deeper = pa.array([], pa.string())
    if cfg.top_k_short > cfg.top_k:
        deeper = deeper_queries(sizes, hits, cfg.min_group_size, cfg.top_k)
    if len(deeper):
        again = search.filter(pc.is_in(search["query_id"], value_set=deeper))
        again = again.set_column(
            again.schema.get_field_index("depth"),
            "depth",
            pa.array([cfg.top_k_short] * again.num_rows, pa.int32()),
        )
        with phase("search_short"):
            hits_short = _search(run, pool_plans, again, docs_uri, index_uris)
        with phase("merge_short"):
            kept = candidates.filter(pc.invert(pc.is_in(candidates["query_id"], value_set=deeper)))
            redone = round_robin(hits_short, rejected, names, again.select(["query_id", "depth"]))
            candidates = pa.concat_tables([kept, redone]).sort_by("query_id")  # stable sort
            sizes = group_sizes(candidates, queries["query_id"])
        hits = pa.concat_tables([hits, hits_short])
    for name in names:
        poolers[name]["hits"] = int(pc.sum(pc.equal(hits["pooler"], name)).as_py() or 0)

    stats = _stats(queries, candidates, sizes, cfg, phase)
    stats.update(
        universe=docs.num_rows,
        universe_dropped_no_abstract_or_date=in_universe - docs.num_rows,
        rejected_citations=rejected.num_rows,
        queries_pooled_deeper=len(deeper),
        poolers=poolers,
    )
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


def pool(cfg: Config, storage: Storage, *, force: bool = False) -> dict[str, Any]:
    """Run (or skip) the pool stage over score-positives' positives; returns its manifest."""
    manifests = {stage: require_manifest(storage, stage) for stage, _ in UPSTREAM.values()}
    uris = {
        arg: manifests[stage]["tables"][table]["uri"] for arg, (stage, table) in UPSTREAM.items()
    }
    # one read of ingest's manifest: the pinned version and the bucket plan cannot disagree
    ingest = require_manifest(storage, INGEST)
    papers, papers_plan = PinnedTable.of(ingest, "papers"), bucket_plan(storage, ingest, "papers")
    return run_stage(
        STAGE,
        cfg,
        storage,
        inputs={
            **{stage: m["run_id"] for stage, m in manifests.items()},
            "ingest": ingest["run_id"],
        },
        config_sections=("pooling",),
        fn=partial(_pool, **uris, papers=papers, papers_plan=papers_plan),
        force=force,
    )
