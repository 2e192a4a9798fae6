"""Query vectors for the Q-D metrics, kept across runs (``ROOT/_embeddings/queries-{key}/``).

synthesize-queries reports Dist-Sim of its set and of the build's queries on every run, and a
nightly refresh reruns it with nearly every query unchanged (its answers come from the LLM
cache): encoding them all again was most of that stage's time. Like the pooling store of
document vectors, the store is keyed by what changes a vector (the model's files, the settings
that change a vector, the query prefix) and each row by the exact text, so a run encodes only
texts no earlier run encoded. It sits outside the run folders, so publishing never deletes it.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds

from cpr_ray.pooling.embeddings import STORE
from cpr_ray.queries.qd_metrics import Embed, embed_once
from cpr_ray.retrieval.spec import EncoderSpec, vector_identity
from cpr_ray.storage import Storage, join

VECTORS = pa.schema([("text", pa.string()), ("embedding", pa.list_(pa.float32()))])


def store_uri(storage: Storage, spec: EncoderSpec) -> str:
    """Where the query vectors of `spec` live, shared by every run of the build."""
    payload = {"side": "query", "query_prefix": spec.query_prefix, **vector_identity(spec)}
    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return join(storage.root, STORE, f"queries-{key}")


def stored(storage: Storage, spec: EncoderSpec, encode: Embed) -> Embed:
    """`encode` (query texts → rows of vectors) backed by the store: each distinct text is
    looked up once per process (`embed_once`), and only texts the store lacks are encoded and
    appended."""
    uri = store_uri(storage, spec)

    def fetched(texts: list[str]) -> np.ndarray:  # distinct texts, none asked before here
        if not texts:
            return encode([])
        found = _read(storage, uri, texts)
        missing = [t for t in texts if t not in found]
        if missing:
            vectors = np.asarray(encode(missing), dtype=np.float32)
            table = pa.table({"text": missing, "embedding": list(vectors)}, schema=VECTORS)
            storage.write_parquet(table, join(uri, f"part-{uuid.uuid4().hex[:12]}.parquet"))
            found.update(zip(missing, vectors, strict=True))
        return np.stack([found[t] for t in texts])

    return embed_once(fetched)


def _read(storage: Storage, uri: str, texts: list[str]) -> dict[str, np.ndarray]:
    parts = [f.path for f in storage.list_files(uri, (".parquet",), missing_ok=True)]
    if not parts:
        return {}
    loc = storage.resolve(uri)
    ds = pds.dataset(parts, filesystem=loc.fs, format="parquet", schema=VECTORS)
    rows = ds.to_table(filter=pds.field("text").isin(texts))
    vectors = rows["embedding"].to_pylist()
    return {
        t: np.asarray(v, dtype=np.float32)
        for t, v in zip(rows["text"].to_pylist(), vectors, strict=True)
    }
