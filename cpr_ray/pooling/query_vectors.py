"""A dense pooler's query vectors, kept across runs in the queries' side of the one vector store
(`retrieval.vector_store`, shared with synthesize-queries' Q-D metrics for the same model).

A search actor used to load the pooler's query encoder (a worker's ``import torch`` and the
model) to encode every query again on every run; a nightly refresh's queries are nearly all
yesterday's. The pool stage now encodes the texts the store lacks where it encodes the
documents the store lacks (one model load for both), and its search actors read the vectors
from the store: a search needs no model. Every run, full or incremental, reads the same stored
vector of a text, so two runs over the same queries score them with the same bits (a text
encoded in another batch could differ in its last bits).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import StorageError
from cpr_ray.queries.query_store import query_store
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.retrieval.vector_store import text_keys
from cpr_ray.storage.store import Storage


def missing_queries(storage: Storage, spec: EncoderSpec, texts: pa.Array) -> pa.Table:
    """(key, text) of the distinct query `texts` whose vector the pooler's store lacks."""
    texts = pc.unique(texts.cast(pa.string()))
    keys = text_keys(texts)
    held = query_store(storage, spec).read(keys, ["key"])["key"]
    known = pc.is_in(keys, value_set=held.combine_chunks().cast(pa.uint64()))
    return pa.table({"key": keys, "text": texts}).filter(pc.invert(known))


def query_vectors(storage: Storage, spec: EncoderSpec, texts: list[str]) -> np.ndarray:
    """(len(texts), dim) float32: each text's stored vector (the stage stored them before it
    searched; a missing one means the store lost it mid-run: rerun pool)."""
    keys = text_keys(pa.array(texts, pa.string()))
    store = query_store(storage, spec)
    rows = store.read(keys, ["key", "embedding"])
    at = pc.index_in(keys, value_set=rows["key"].combine_chunks().cast(pa.uint64()))
    if rows.num_rows == 0 or at.null_count:
        raise StorageError(
            f"query vector store {store.uri} lacks {at.null_count or len(texts):,} of "
            f"{len(texts):,} query texts; rerun pool (cpr build --stages pool --force)"
        )
    emb = rows["embedding"].combine_chunks()
    vectors = emb.flatten().to_numpy().reshape(len(emb), emb.type.list_size)
    return np.ascontiguousarray(vectors[at.to_numpy()], dtype=np.float32)
