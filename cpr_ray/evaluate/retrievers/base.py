"""The one retriever interface, and retrievers by name.

A retriever indexes the benchmark's documents (by position), then either scores each query's
candidate pool or searches the whole index:

- ``index(texts)``;
- ``score(queries, pools) -> (n_q, m)`` scores aligned with ``pools`` (PAD cells: -inf);
- ``search(queries, k) -> (positions (n_q, k), scores (n_q, k))``, best first.

Encoder-backed retrievers also have ``uses_ray(n_docs)``: the runner then makes sure Ray is up
before ``index`` so that a large collection is encoded on an actor pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

RETRIEVERS = ("bm25", "dense", "splade")


@runtime_checkable
class Retriever(Protocol):
    name: str
    model: str | None

    def index(self, texts: Sequence[str]) -> None: ...

    def score(self, queries: Sequence[str], pools: np.ndarray) -> np.ndarray: ...

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class RetrieverOptions:
    """Every knob of every retriever; each retriever reads the ones it has."""

    # bm25 (Lucene variant)
    k1: float = 1.2
    b: float = 0.75
    # dense / splade
    pooling: str = "auto"
    query_prefix: str | None = None
    doc_prefix: str | None = None
    max_length: int = 512
    batch_size: int = 32
    threads: int | None = None
    search_backend: str = "numpy"  # numpy (exact) | faiss
    faiss_index: str = "Flat"  # a faiss index_factory string; Flat is exact
    # large corpora: encoded on a Ray Data actor pool when Ray is up
    ray_min_docs: int = 20_000
    ray_max_actors: int = 2
    ray_batch_size: int = 256
    ray_num_gpus: float = 0.0

    def __post_init__(self) -> None:
        if self.search_backend not in ("numpy", "faiss"):
            raise ValueError(f"unknown search_backend {self.search_backend!r}; use numpy or faiss")


DEFAULT_DENSE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_SPLADE_MODEL = "naver/splade-v3"


def make_retriever(
    name: str, model: str | None = None, options: RetrieverOptions | None = None
) -> Retriever:
    """`bm25`, `dense` (MODEL: any sentence-transformers/transformers path or hub name) or
    `splade` (MODEL: a masked-LM checkpoint)."""
    opts = options or RetrieverOptions()
    if name == "bm25":
        from cpr_ray.evaluate.retrievers.bm25 import BM25Retriever

        if model:
            raise ValueError("bm25 takes no --model")
        return BM25Retriever(k1=opts.k1, b=opts.b)
    if name in ("dense", "splade"):
        from cpr_ray.evaluate.retrievers.encoders import EncoderSpec
        from cpr_ray.evaluate.retrievers.neural import DenseRetriever, SpladeRetriever

        spec = EncoderSpec(
            model=model or (DEFAULT_DENSE_MODEL if name == "dense" else DEFAULT_SPLADE_MODEL),
            pooling=opts.pooling,
            query_prefix=opts.query_prefix,
            doc_prefix=opts.doc_prefix,
            max_length=opts.max_length,
            batch_size=opts.batch_size,
            threads=opts.threads,
        )
        cls = DenseRetriever if name == "dense" else SpladeRetriever
        return cls(spec, opts)
    raise ValueError(f"unknown retriever {name!r}; known: {', '.join(RETRIEVERS)}")
