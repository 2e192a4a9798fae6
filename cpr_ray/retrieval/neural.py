"""Dense and SPLADE retrievers over the encoders: inner-product search in NumPy (exact) or faiss.

Documents are encoded in-process, or on a Ray Data actor pool when Ray is up and the collection
has at least ``ray_min_docs`` documents. Queries are encoded in-process. With the faiss backend
the documents go into a :class:`~cpr_ray.retrieval.faiss_index.VectorIndex` whose ids are their
positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from cpr_ray.retrieval.base import PAD, top_k_rows
from cpr_ray.retrieval.encoder import DenseEncoder, SpladeEncoder
from cpr_ray.retrieval.faiss_index import VectorIndex
from cpr_ray.retrieval.ray_encode import Kind, encode_with_ray
from cpr_ray.retrieval.spec import EncoderSpec, RetrieverOptions

QUERY_CHUNK = 256
SPARSE_QUERY_CHUNK = 32  # SPLADE scores a dense (chunk x corpus) block at a time


def _ray_is_up() -> bool:
    import ray

    return ray.is_initialized()


class _Neural:
    name = "neural"
    kind: Kind = "dense"

    def __init__(self, spec: EncoderSpec, options: RetrieverOptions | None = None) -> None:
        self.spec = spec
        self.options = options or RetrieverOptions()
        self.model = spec.model
        self._encoder: DenseEncoder | SpladeEncoder | None = None
        self.encoded_with_ray = False

    @property
    def encoder(self) -> DenseEncoder | SpladeEncoder:
        if self._encoder is None:
            cls = DenseEncoder if self.kind == "dense" else SpladeEncoder
            self._encoder = cls(self.spec)
        return self._encoder

    def uses_ray(self, n_docs: int) -> bool:
        return n_docs >= self.options.ray_min_docs

    def _encode_docs(self, texts: Sequence[str]):
        if self.uses_ray(len(texts)) and _ray_is_up():
            self.encoded_with_ray = True
            vocab = self.encoder.dim if self.kind == "splade" else None
            opts = self.options.ray  # the encoder actors (the `encoder:` section's)
            return encode_with_ray(list(texts), self.spec, self.kind, opts, vocab_size=vocab)
        return self.encoder.encode_docs(list(texts))


class DenseRetriever(_Neural):
    name = "dense"
    kind = "dense"

    def index(self, texts: Sequence[str]) -> None:
        self.docs = np.ascontiguousarray(self._encode_docs(texts), dtype=np.float32)  # (N, d)
        resolved = self.spec.resolved()
        # a query that is also a document (AnaloBench) reuses its embedding when both sides
        # are encoded the same way
        self._same_side = resolved.query_prefix == resolved.doc_prefix
        self._texts = texts
        self._faiss = None
        if self.options.search_backend == "faiss":
            ids = np.arange(len(self.docs), dtype=np.int64)
            self._faiss = VectorIndex(ids, self.docs, self.options.faiss_index)

    def _queries(self, queries: Sequence[str]) -> np.ndarray:
        wanted = set(queries) if self._same_side else set()
        found = {t: i for i, t in enumerate(self._texts) if t in wanted} if wanted else {}
        rows = [found.get(q, -1) for q in queries]
        todo = [i for i, r in enumerate(rows) if r < 0]
        out = np.empty((len(queries), self.docs.shape[1]), dtype=np.float32)
        if todo:
            encoder = self.encoder
            assert isinstance(encoder, DenseEncoder)  # kind "dense"
            out[todo] = encoder.encode_queries([queries[i] for i in todo])
        known = [i for i, r in enumerate(rows) if r >= 0]
        out[known] = self.docs[[rows[i] for i in known]]
        return out

    def score(self, queries: Sequence[str], pools: np.ndarray) -> np.ndarray:
        q = self._queries(queries)  # (n_q, d)
        out = np.full(pools.shape, -np.inf, dtype=np.float32)
        for s in range(0, len(q), QUERY_CHUNK):
            cand = pools[s : s + QUERY_CHUNK]  # (c, m)
            emb = self.docs[np.where(cand == PAD, 0, cand)]  # (c, m, d)
            scores = np.einsum("cmd,cd->cm", emb, q[s : s + QUERY_CHUNK])  # (c, m)
            out[s : s + QUERY_CHUNK] = np.where(cand == PAD, -np.inf, scores)
        return out

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(self._queries(queries), dtype=np.float32)
        k = min(k, len(self.docs))
        if self._faiss is not None:
            return self._faiss.search(q, k)
        parts = [
            top_k_rows(q[s : s + QUERY_CHUNK] @ self.docs.T, k)
            for s in range(0, len(q), QUERY_CHUNK)
        ]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


class SpladeRetriever(_Neural):
    name = "splade"
    kind = "splade"

    def index(self, texts: Sequence[str]) -> None:
        self.docs = sp.csr_matrix(self._encode_docs(texts), dtype=np.float32)  # (N, V)
        self._docs_t = self.docs.T.tocsr()  # (V, N) for query-by-corpus products

    def _encode_queries(self, queries: Sequence[str]) -> sp.csr_matrix:
        encoder = self.encoder
        assert isinstance(encoder, SpladeEncoder)  # kind "splade"
        return encoder.encode_queries(list(queries))

    def _similarity(self, q: sp.csr_matrix) -> np.ndarray:
        return np.asarray((q @ self._docs_t).todense(), dtype=np.float32)  # (c, N)

    def score(self, queries: Sequence[str], pools: np.ndarray) -> np.ndarray:
        q = self._encode_queries(queries)
        out = np.full(pools.shape, -np.inf, dtype=np.float32)
        for s in range(0, q.shape[0], SPARSE_QUERY_CHUNK):
            cand = pools[s : s + SPARSE_QUERY_CHUNK]
            sim = self._similarity(q[s : s + SPARSE_QUERY_CHUNK])  # (c, N)
            scores = np.take_along_axis(sim, np.where(cand == PAD, 0, cand), axis=1)
            out[s : s + SPARSE_QUERY_CHUNK] = np.where(cand == PAD, -np.inf, scores)
        return out

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._encode_queries(queries)
        k = min(k, self.docs.shape[0])
        parts = [
            top_k_rows(self._similarity(q[s : s + SPARSE_QUERY_CHUNK]), k)
            for s in range(0, q.shape[0], SPARSE_QUERY_CHUNK)
        ]
        if not parts:
            return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
