"""Retrievers by name: what `--retriever NAME --model MODEL` builds.

Apart from the interface (``base.py``) so that the retrievers can import the interface without
importing each other.
"""

from __future__ import annotations

from cpr_ray.retrieval.base import Retriever
from cpr_ray.retrieval.spec import RetrieverOptions

RETRIEVERS = ("bm25", "dense", "splade", "hybrid")

DEFAULT_DENSE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_SPLADE_MODEL = "naver/splade-v3"


def make_retriever(
    name: str, model: str | None = None, options: RetrieverOptions | None = None
) -> Retriever:
    """`bm25`, `dense` (MODEL: any sentence-transformers/transformers path or hub name),
    `splade` (MODEL: a masked-LM checkpoint) or `hybrid` (`dense` with MODEL and `bm25`, fused
    as ``options.fusion`` says)."""
    opts = options or RetrieverOptions()
    if name == "bm25":
        from cpr_ray.retrieval.bm25 import BM25Retriever

        if model:
            raise ValueError("bm25 takes no --model")
        return BM25Retriever(k1=opts.k1, b=opts.b)
    if name == "hybrid":
        from cpr_ray.retrieval.bm25 import BM25Retriever
        from cpr_ray.retrieval.hybrid import HybridRetriever
        from cpr_ray.retrieval.neural import DenseRetriever

        dense = DenseRetriever(opts.encoder_spec(model or DEFAULT_DENSE_MODEL), opts)
        return HybridRetriever(dense, BM25Retriever(k1=opts.k1, b=opts.b), opts.fusion, opts.seed)
    if name in ("dense", "splade"):
        from cpr_ray.retrieval.neural import DenseRetriever, SpladeRetriever

        default = DEFAULT_DENSE_MODEL if name == "dense" else DEFAULT_SPLADE_MODEL
        cls = DenseRetriever if name == "dense" else SpladeRetriever
        return cls(opts.encoder_spec(model or default), opts)
    raise ValueError(f"unknown retriever {name!r}; known: {', '.join(RETRIEVERS)}")
