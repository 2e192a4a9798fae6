"""Query vectors kept across runs, for the Q-D metrics and the dense poolers' searches
(`pooling.query_vectors`): the queries' side of the one vector store (`retrieval.vector_store`).

synthesize-queries reports Dist-Sim of its set and of the build's queries on every run, and a
nightly refresh reruns it with nearly every query unchanged (its answers come from the LLM
cache): encoding them all again was most of that stage's time. The store is keyed by the spec's
query identity (the model's files, the settings that change a vector, the query prefix) and
each row by the exact text, so a run encodes only texts no earlier run encoded.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from cpr_ray.queries.qd_metrics import Embed, embed_once
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.retrieval.vector_store import VectorStore, text_keys
from cpr_ray.storage.store import Storage


def query_store(storage: Storage, spec: EncoderSpec) -> VectorStore:
    """Where the query vectors of `spec` live, shared by every run of the build."""
    return VectorStore(storage, spec, "dense", "queries")


def stored(storage: Storage, spec: EncoderSpec, encode: Embed) -> Embed:
    """`encode` (query texts → rows of vectors) backed by the store: each distinct text is
    looked up once per process (`embed_once`), and only texts the store lacks are encoded and
    appended."""
    store = query_store(storage, spec)

    def fetched(texts: list[str]) -> np.ndarray:  # distinct texts, none asked before here
        if not texts:
            return encode([])
        keys = text_keys(pa.array(texts, pa.string())).to_numpy()
        rows = store.read(pa.array(keys), ["key", "embedding"])
        found = dict(zip(rows["key"].to_numpy(), _vectors(rows["embedding"]), strict=True))
        missing = [t for t, k in zip(texts, keys, strict=True) if k not in found]
        if missing:
            vectors = np.asarray(encode(missing), dtype=np.float32)
            new = text_keys(pa.array(missing, pa.string()))
            flat = pa.array(vectors.reshape(-1))
            embedding = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
            store.append(pa.table({"key": new, "embedding": embedding}))
            found.update(zip(new.to_numpy(), vectors, strict=True))
        return np.stack([found[k] for k in keys])

    return embed_once(fetched)


def _vectors(column: pa.ChunkedArray) -> np.ndarray:
    """(n, d) float32 of a fixed-size list column; (0, 0) when empty."""
    if len(column) == 0:
        return np.zeros((0, 0), np.float32)
    values = column.combine_chunks()
    return values.flatten().to_numpy().reshape(len(values), -1).astype(np.float32, copy=False)
