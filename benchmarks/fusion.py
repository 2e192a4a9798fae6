"""Which fusion should hybrid retrieval use? A sweep of the `fusion:` settings on the benchmarks
a clone has, each against dense and BM25 alone.

Sets (each skipped, saying so, where it is not there):

- ``cpr-full``: the dry run's export (``--export``; default the newest run under
  ``cpr-dry-run/export/runs/``), whole-corpus search, each query's own paper left out;
- ``beir-synthetic``: a BEIR folder written here from the bundled sample's abstracts (the query
  is an abstract's first sentence, its document the rest), whole-corpus search;
- ``analobench-t2``: AnaloBench from ``../shared/reference/analobench`` (``--analobench``), a
  pooled benchmark: the fusion runs inside each query's 200 candidates.

Every ranking comes from the code `cpr eval --retriever hybrid` runs (`runner.rank` over a
`HybridRetriever`, whose fusion is the one `cpr search` uses); each side is searched once and
its ranking reused by every setting. Printed per set: the random baseline, dense and BM25 alone,
and per setting nDCG@10 and R@10 with the paired bootstrap interval (2,000 resamples of the
queries, 95%) of its nDCG@10 difference to RRF k=60 depth 100 (the default), to dense alone and
to BM25 alone. The rule (docs/search.md, "Choosing the fusion"): keep RRF k=60 unless another
setting's interval against it stays above 0 on at least two sets.

Usage:

    python benchmarks/fusion.py [--model PATH] [--export RUN] [--analobench DIR] [--docs 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_texts import abstracts  # noqa: E402

from cpr_ray.config import load_config, minilm_dir  # noqa: E402
from cpr_ray.evaluate.benchmark import Benchmark  # noqa: E402
from cpr_ray.evaluate.bootstrap import bootstrap_ci  # noqa: E402
from cpr_ray.evaluate.eval_run import rank  # noqa: E402
from cpr_ray.evaluate.loaders import load_benchmark  # noqa: E402
from cpr_ray.evaluate.summary import query_scores  # noqa: E402
from cpr_ray.retrieval import make_retriever  # noqa: E402
from cpr_ray.retrieval.fusion import Fusion  # noqa: E402
from cpr_ray.retrieval.hybrid import HybridRetriever  # noqa: E402
from cpr_ray.storage.store import Storage  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = Fusion()  # rrf k=60, depth 100
SETTINGS = [
    DEFAULT,
    Fusion(method="rrf", k=10),
    Fusion(method="rrf", k=30),
    Fusion(method="rrf", k=100),
    Fusion(method="rrf", k=60, depth=20),
    Fusion(method="rrf", k=60, depth=50),
    Fusion(method="rrf", k=60, depth=200),
    Fusion(method="convex", weight=0.3),
    Fusion(method="convex", weight=0.5),
    Fusion(method="convex", weight=0.7),
]
TOP_K = 100  # whole-corpus depth of the rankings measured (cpr eval's eval.top_k)
METRICS = ("ndcg_at_10", "recall_at_10")


class Once:
    """One side's results computed once and sliced for every setting: its deepest search and
    its pool scores, keyed by the queries asked."""

    def __init__(self, retriever, deepest: int) -> None:
        self.retriever, self.deepest = retriever, deepest
        self.name, self.model = retriever.name, retriever.model
        self._search: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._score: dict[tuple[str, ...], np.ndarray] = {}

    def search(self, queries: Sequence[str], k: int):
        key = tuple(queries)
        if key not in self._search:
            self._search[key] = self.retriever.search(queries, self.deepest)
        idx, val = self._search[key]
        assert k <= self.deepest, (k, self.deepest)
        return idx[:, :k], val[:, :k]

    def score(self, queries: Sequence[str], pools: np.ndarray) -> np.ndarray:
        key = tuple(queries)
        if key not in self._score:
            self._score[key] = self.retriever.score(queries, pools)
        return self._score[key]


def synthetic_beir(root: Path, n_docs: int, n_queries: int) -> Path:
    """A BEIR folder from the sample's abstracts: query = an abstract's first sentence, its one
    relevant document = the rest of that abstract."""
    texts = list(dict.fromkeys(abstracts(n_docs * 2)))[:n_docs]
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    docs, queries, qrels = [], [], []
    for i, text in enumerate(texts):
        parts = re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)
        if len(queries) < n_queries and len(parts) == 2 and len(parts[0].split()) >= 6:
            queries.append({"_id": f"q{i}", "text": parts[0]})
            qrels.append(f"q{i}\td{i}\t1")
            text = parts[1]
        docs.append({"_id": f"d{i}", "title": "", "text": text})
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels))
    return root


def newest_export() -> Path | None:
    runs = sorted((ROOT / "cpr-dry-run" / "export" / "runs").glob("*/cpr-eval.parquet"))
    return runs[-1].parent if runs else None


def per_query(bench: Benchmark, ranked: list[np.ndarray]) -> tuple[dict, dict]:
    scores = query_scores(bench, ranked)
    return {m: scores.values[m] for m in METRICS}, {m: scores.random[m] for m in METRICS}


def interval(a: np.ndarray, b: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Mean of a - b over queries, and its paired bootstrap interval (the same resamples)."""
    low, high = bootstrap_ci({"d": a - b}, seed=seed)["d"]
    return float(np.mean(a - b)), low, high


def sweep(name: str, bench: Benchmark, model: str) -> list[dict]:
    t = time.perf_counter()
    deepest = max(s.side_depth(TOP_K) for s in SETTINGS) + max(
        (len(e) for e in bench.excluded or []), default=0
    )
    dense = Once(make_retriever("dense", model), deepest)
    bm25 = Once(make_retriever("bm25"), deepest)
    dense.retriever.index(bench.doc_texts)
    bm25.retriever.index(bench.doc_texts)
    alone = {"dense": rank(bench, dense, bench.queries, top_k=TOP_K)}
    alone["bm25"] = rank(bench, bm25, bench.queries, top_k=TOP_K)
    values = {side: per_query(bench, r)[0] for side, r in alone.items()}
    random = per_query(bench, alone["dense"])[1]
    fused = {}
    for s in SETTINGS:
        hybrid = HybridRetriever(dense, bm25, s)  # the fusion cpr search and cpr eval run
        fused[s] = per_query(bench, rank(bench, hybrid, bench.queries, top_k=TOP_K))[0]
    n = len(values["dense"]["ndcg_at_10"])
    print(f"\n## {name}: {n} queries, {len(bench.doc_ids):,} documents")
    print(
        f"random nDCG@10 {np.mean(random['ndcg_at_10']):.3f}, R@10 "
        f"{np.mean(random['recall_at_10']):.3f} · dense nDCG@10 "
        f"{np.mean(values['dense']['ndcg_at_10']):.3f}, R@10 "
        f"{np.mean(values['dense']['recall_at_10']):.3f} · BM25 nDCG@10 "
        f"{np.mean(values['bm25']['ndcg_at_10']):.3f}, R@10 "
        f"{np.mean(values['bm25']['recall_at_10']):.3f}"
    )
    print(
        "| fusion | nDCG@10 | R@10 | ΔnDCG vs rrf k=60 d100 [95% CI] | ΔnDCG vs dense | "
        "ΔnDCG vs BM25 |"
    )
    print("|---|---|---|---|---|---|")
    rows = []
    for s, v in fused.items():
        ndcg = v["ndcg_at_10"]
        cells = [
            interval(ndcg, other)
            for other in (
                fused[DEFAULT]["ndcg_at_10"],
                values["dense"]["ndcg_at_10"],
                values["bm25"]["ndcg_at_10"],
            )
        ]
        text = [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in cells]
        print(
            f"| {s.label} | {np.mean(ndcg):.3f} | {np.mean(v['recall_at_10']):.3f} | "
            + " | ".join(text)
            + " |"
        )
        rows.append({"set": name, "fusion": s, "vs_default": cells[0]})
    print(f"({time.perf_counter() - t:.0f} s)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(minilm_dir()), help="dense model (default MiniLM)")
    ap.add_argument("--export", default=None, help="a dry run's export folder (cpr-full)")
    ap.add_argument(
        "--analobench",
        default=str(ROOT.parent / "shared" / "reference" / "analobench"),
        help="AnaloBench's folder",
    )
    ap.add_argument("--docs", type=int, default=3000, help="synthetic BEIR documents")
    ap.add_argument("--queries", type=int, default=300, help="synthetic BEIR queries")
    ap.add_argument(
        "--sets", default="cpr-full,beir,analobench", help="comma-separated: which sets to run"
    )
    args = ap.parse_args()
    storage = Storage(load_config().storage)
    wanted = set(args.sets.split(","))
    rows: list[dict] = []
    export = Path(args.export) if args.export else newest_export()
    analobench = Path(args.analobench, "AnaloBench-T2-Base.csv")
    if "cpr-full" in wanted and export is not None and (export / "cpr-eval.parquet").exists():
        bench = load_benchmark("cpr-full", storage, str(export))[0]
        rows += sweep(f"cpr-full ({export.name})", bench, args.model)
    elif "cpr-full" in wanted:
        print("cpr-full: skipped, no dry-run export (run `make dry-run`, or give --export)")
    if "beir" in wanted:
        with tempfile.TemporaryDirectory() as tmp:
            beir = synthetic_beir(Path(tmp) / "beir", args.docs, args.queries)
            bench = load_benchmark("beir", storage, str(beir))[0]
            rows += sweep("beir-synthetic", bench, args.model)
    if "analobench" in wanted and analobench.exists():
        bench = load_benchmark("analobench", storage, args.analobench, subset="t2")[0]
        rows += sweep("analobench-t2", bench, args.model)
    elif "analobench" in wanted:
        print(f"analobench-t2: skipped, no {analobench}")
    ran = {r["set"] for r in rows}
    print(
        "\n## The rule: another setting replaces rrf k=60 d100 only if its interval is above 0 "
        f"on at least two of the {len(ran)} sets"
    )
    for s in SETTINGS[1:]:
        above = [r["set"] for r in rows if r["fusion"] == s and r["vs_default"][1] > 0]
        print(f"- {s.label}: above on {len(above)} ({', '.join(above) or 'none'})")
    winners = [
        s
        for s in SETTINGS[1:]
        if sum(r["fusion"] == s and r["vs_default"][1] > 0 for r in rows) >= 2
    ]
    print("kept: rrf k=60 d100" if not winners else f"replace by: {winners[0].label}")


if __name__ == "__main__":
    main()
