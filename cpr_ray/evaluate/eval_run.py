"""One evaluation run: load -> (rewrite) -> index -> rank -> (rerank) -> metrics -> results.

The steps are plain functions over a :class:`Benchmark`; :func:`run_eval` wires them, times each
stage and returns the results dict (``results.py`` writes it). The retriever, reranker and
rewriter can be passed in (tests, notebooks); otherwise they are built from the config: the
reranker by `cpr_ray.retrieval.rerank.llm_reranker`, the rewriter by ``rewriters.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cpr_ray.config import Config
from cpr_ray.evaluate import eval_config_check
from cpr_ray.evaluate.benchmark import Benchmark, positions
from cpr_ray.evaluate.ir_metrics import METRICS
from cpr_ray.evaluate.loaders import load_benchmark
from cpr_ray.evaluate.protocols import QueryRewriter, llm_query_rewriter
from cpr_ray.evaluate.robustness import SAME_TOPIC, without_groups
from cpr_ray.evaluate.summary import SummaryOptions, metric_blocks, query_scores, summarize
from cpr_ray.retrieval import Retriever, make_retriever
from cpr_ray.retrieval.base import PAD
from cpr_ray.retrieval.fusion import reciprocal_rank_fusion
from cpr_ray.retrieval.hybrid import HybridRetriever
from cpr_ray.retrieval.ranking import drop_excluded, rank_pools
from cpr_ray.retrieval.rerank import Reranker, llm_reranker
from cpr_ray.retrieval.spec import RetrieverOptions
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage


@dataclass
class Timer:
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, started: float) -> None:
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + time.perf_counter() - started, 3)


def rank(
    bench: Benchmark,
    retriever: Retriever,
    texts: Sequence[str | Sequence[str]],
    *,
    top_k: int = 100,
    seed: int = 0,
    fusion_k: int = 60,
) -> list[np.ndarray]:
    """Per query, doc positions best first: its whole pool, or the corpus top `top_k`.

    A query given as several texts is ranked once per text and fused (reciprocal rank fusion).
    """
    flat: list[str] = []
    owner: list[int] = []
    for i, t in enumerate(texts):
        items = [t] if isinstance(t, str) else list(t)
        if not items:
            raise ValueError(f"query {bench.query_ids[i]}: the rewriter returned no text")
        flat.extend(items)
        owner.extend([i] * len(items))
    rows = np.asarray(owner, dtype=np.int64)
    if bench.pools is not None:
        pools = bench.pools[rows]
        ranked = rank_pools(retriever.score(flat, pools), pools, seed)
    else:
        excluded = None if bench.excluded is None else [bench.excluded[o] for o in owner]
        if isinstance(retriever, HybridRetriever):  # excluded before fusion, as cpr search does
            idx, _ = retriever.search(flat, top_k, excluded)
            ranked = [r[r != PAD] for r in idx]
        else:
            extra = max((len(e) for e in bench.excluded), default=0) if bench.excluded else 0
            idx, _ = retriever.search(flat, top_k + extra)
            ranked = drop_excluded(list(idx), excluded, top_k)
    if len(flat) == len(texts):
        return ranked
    out: list[list[np.ndarray]] = [[] for _ in texts]
    for r, o in zip(ranked, owner):
        out[o].append(r)
    return [
        np.asarray(reciprocal_rank_fusion([x.tolist() for x in rs], k=fusion_k), dtype=np.int64)
        if len(rs) > 1
        else rs[0]
        for rs in out
    ]


def rerank(
    bench: Benchmark, ranked: Sequence[np.ndarray], reranker: Reranker, depth: int | None
) -> list[np.ndarray]:
    """Reorder each ranking's top `depth` (all when None) with `reranker`; the rest stays."""
    index = positions(bench.doc_ids)
    heads = [r if depth is None else r[:depth] for r in ranked]
    cands = [[bench.doc_ids[p] for p in h] for h in heads]
    new = reranker.rerank(bench.queries, cands)
    if len(new) != len(cands):
        raise ValueError(f"reranker {reranker.name} returned {len(new)} rankings for {len(cands)}")
    out = []
    for qid, before, after, r, h in zip(bench.query_ids, cands, new, ranked, heads):
        if sorted(before) != sorted(after):
            raise ValueError(
                f"reranker {reranker.name} changed the candidate set of query {qid} "
                "(it must return a permutation)"
            )
        head = np.array([index[d] for d in after], dtype=np.int64)
        out.append(np.concatenate([head, r[len(h) :]]))
    return out


def summarize_parts(
    parts: Sequence[Benchmark], rankings: Sequence[list[np.ndarray]], opts: SummaryOptions
) -> dict[str, Any]:
    """One part: its summary. Several (BRIGHT subsets): pooled over all queries, per subset, and
    the macro average of the subsets."""
    if len(parts) == 1:
        return summarize(parts[0], rankings[0], opts)
    per = {p.name: summarize(p, r, opts) for p, r in zip(parts, rankings)}
    scores = [query_scores(p, r, opts.gain) for p, r in zip(parts, rankings)]
    values = {m: np.concatenate([s.values[m] for s in scores]) for m in METRICS}
    random = {m: np.concatenate([s.random[m] for s in scores]) for m in METRICS}
    sizes = np.concatenate([s.pool_sizes for s in scores])
    return {
        "n_queries": int(sum(s.keep.sum() for s in scores)),
        "n_queries_without_relevant": int(sum((~s.keep).sum() for s in scores)),
        "n_candidates_mean": float(sizes.mean()) if len(sizes) else 0.0,
        "n_documents": int(sum(len(p.doc_ids) for p in parts)),
        **metric_blocks(values, random, opts, opts.seed),
        "per_domain": {},
        "per_subset": per,
        "macro_over_subsets": {
            m: float(np.mean([b[m]["value"] for b in per.values()])) for m in METRICS
        },
    }


def _run_part(
    part: Benchmark,
    cfg: Config,
    timer: Timer,
    retriever: Retriever | None,
    reranker: Reranker | None,
    rewriter: QueryRewriter | None,
) -> tuple[list[np.ndarray], dict[str, Any], Reranker | None]:
    """Rankings of one benchmark part, the names of what made them, and the reranker used."""
    ev = cfg.eval
    t = time.perf_counter()
    if ev.rewrite and rewriter is None:
        rewriter = llm_query_rewriter(ev.rewrite, cfg, part.train_pairs)
    if ev.rerank and reranker is None:
        reranker = llm_reranker(cfg, dict(zip(part.doc_ids, part.doc_texts)))
    texts: list[str | list[str]] = list(part.queries)
    if rewriter is not None:
        texts = rewriter.rewrite(part.queries)
        if len(texts) != part.n_queries:
            raise ValueError(
                f"rewriter {rewriter.name} returned {len(texts)} rewrites for "
                f"{part.n_queries} queries"
            )
        # searched as returned: RAG-Fusion's rewriter already leads with the original query
        # (eval.fusion_include_original); adding it here too counted it twice in the fusion
    timer.add("rewrite_s", t)

    t = time.perf_counter()
    assert ev.retriever is not None  # settings.check required it
    retriever = retriever or make_retriever(
        ev.retriever, cfg.encoder.model, RetrieverOptions.from_config(cfg)
    )
    uses_ray = getattr(retriever, "uses_ray", None)  # encoders: large corpora go to actors
    if uses_ray is not None and uses_ray(len(part.doc_ids)):
        from cpr_ray.runs.ray_runtime import ensure_ray

        ensure_ray(cfg.ray)
    retriever.index(part.doc_texts)
    timer.add("index_s", t)

    t = time.perf_counter()
    ranked = rank(part, retriever, texts, top_k=ev.top_k, seed=ev.seed, fusion_k=ev.fusion_k)
    timer.add("retrieve_s", t)

    if reranker is not None:
        t = time.perf_counter()
        depth = ev.rerank_depth or (None if part.has_pools else ev.top_k)
        ranked = rerank(part, ranked, reranker, depth)
        timer.add("rerank_s", t)
    names = {
        "retriever": retriever.name,
        "model": retriever.model,
        "rerank": reranker.name if reranker is not None else None,
        "rewrite": rewriter.name if rewriter is not None else None,
        "fusion": retriever.fusion.describe() if isinstance(retriever, HybridRetriever) else None,
    }
    return ranked, names, reranker


def run_eval(
    cfg: Config,
    *,
    retriever: Retriever | None = None,
    reranker: Reranker | None = None,
    rewriter: QueryRewriter | None = None,
    storage: Storage | None = None,
) -> dict[str, Any]:
    """Evaluate one retriever (+ reranker/rewriter) on one benchmark; returns the results dict."""
    from cpr_ray.evaluate.results import build_results

    eval_config_check.check(cfg)  # before loading or encoding anything
    ev = cfg.eval
    timer = Timer()
    started = time.perf_counter()
    storage = storage or Storage(cfg.storage)
    assert ev.benchmark is not None and ev.data is not None  # settings.check required them
    with leases.reading(storage, ev.data):
        parts = load_benchmark(ev.benchmark, storage, ev.data, subset=ev.subset, seed=ev.seed)
    timer.add("load_s", started)
    rankings: list[list[np.ndarray]] = []
    rerankers: dict[int, Reranker] = {}
    names: dict[str, Any] = {}
    for part in parts:
        ranked, names, used = _run_part(part, cfg, timer, retriever, reranker, rewriter)
        rankings.append(ranked)
        if used is not None:
            rerankers[id(used)] = used

    t = time.perf_counter()
    opts = SummaryOptions(ev.seed, ev.resamples, ev.confidence, ev.gain)
    summary = summarize_parts(parts, rankings, opts)
    robustness: dict[str, Any] = {}
    if ev.robustness and len(parts) == 1 and parts[0].pool_groups is not None:
        reduced, reduced_ranked = without_groups(parts[0], rankings[0], SAME_TOPIC)
        robustness["without_same_topic"] = summarize(reduced, reduced_ranked, opts)
    rerank_stats: dict[str, int] = {}
    for r in rerankers.values():  # counters of each distinct reranker object, summed
        stats: Any = getattr(r, "stats", None)
        for key, value in (stats.as_dict() if hasattr(stats, "as_dict") else {}).items():
            rerank_stats[key] = rerank_stats.get(key, 0) + value
    timer.add("metrics_s", t)
    timer.seconds["total_s"] = round(time.perf_counter() - started, 3)
    return build_results(
        cfg,
        parts,
        summary,
        names=names,
        timing=timer.seconds,
        robustness=robustness,
        rerank_stats=rerank_stats,
    )
