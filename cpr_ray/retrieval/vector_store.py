"""The one store of cached vectors, kept across runs: documents' and queries', per encoder.

``ROOT/_embeddings/{key}/`` holds Parquet parts of the vectors one encoder made. The folder's key
is derived from the encoder's spec (its `vector_identity`: the model's files and the settings
that change a vector; a query store adds the query instruction, `query_identity`) and the kind
of vector, so a changed model or setting is another store and a retrained model never serves
stale vectors. Each row is keyed by the exact text encoded (`text_keys`), so a run encodes only
texts no earlier run encoded. Like the LLM cache, the store sits outside the run folders, so
publishing a run never deletes it.

A row: ``key`` (uint64), the document's ``corpus_id`` where the text is a paper's, and the
vector: ``embedding`` (dense: a fixed-size list of float32) or ``indices``/``values`` (SPLADE's
nonzero vocabulary weights). Its two uses: the pool stage's document vectors
(`pooling.embeddings`, written by its encoder actors) and the query vectors of the Q-D metrics
(`queries.query_store`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from cpr_ray.retrieval.spec import EncoderSpec, identity_key, query_identity, vector_identity
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import duckdb_sql as duck

STORE = "_embeddings"
Side = Literal["documents", "queries"]
Kind = Literal["dense", "splade"]


def text_keys(texts: pa.Array, owners: pa.Array | None = None) -> pa.Array:
    """A uint64 key of each exact text encoded (of its paper too, with `owners`: corpus ids): a
    vector is reused only for the same text, so a corrected abstract is encoded again.
    MD5-based, so stable across versions."""
    if owners is None:
        t, sql = pa.table({"text": texts}), "SELECT md5_number_lower(text) AS key FROM t"
    else:
        t = pa.table({"id": owners, "text": texts})
        sql = "SELECT md5_number_lower(id::VARCHAR || chr(0) || text) AS key FROM t"
    return duck.query(sql, t=t)["key"].combine_chunks()


def vector_columns(kind: str) -> list[str]:
    return ["embedding"] if kind == "dense" else ["indices", "values"]


def store_key(spec: EncoderSpec, kind: Kind = "dense", side: Side = "documents") -> str:
    """The folder name of a store: documents' vectors depend on the spec's vector identity
    alone (poolers differing only in query settings share a store), queries' on the query
    instruction too."""
    identity = query_identity(spec) if side == "queries" else vector_identity(spec)
    key = identity_key({"kind": kind, **identity})
    return f"queries-{key}" if side == "queries" else key


@dataclass(frozen=True)
class VectorStore:
    """The vectors of one encoder (`spec`), of one kind, for documents or for queries."""

    storage: Storage
    spec: EncoderSpec
    kind: Kind = "dense"
    side: Side = "documents"

    @property
    def key(self) -> str:
        """The store's folder name: documents' vectors depend on the spec's vector identity
        alone (poolers differing only in query settings share a store), queries' on the query
        instruction too."""
        identity = (
            query_identity(self.spec) if self.side == "queries" else vector_identity(self.spec)
        )
        key = identity_key({"kind": self.kind, **identity})
        return f"queries-{key}" if self.side == "queries" else key

    @property
    def uri(self) -> str:
        """Where the vectors live, shared by every run of the build."""
        return join(self.storage.root, STORE, self.key)

    def _parts(self) -> list[str]:
        return [f.path for f in self.storage.list_files(self.uri, (".parquet",), missing_ok=True)]

    def keys(self) -> pa.Array:
        """The key of every text the store holds a vector of (uint64; repeats possible)."""
        parts = self._parts()
        if not parts:
            return pa.array([], pa.uint64())
        return self._dataset(parts).to_table(columns=["key"])["key"].combine_chunks()

    def read(self, keys: pa.Array, columns: list[str]) -> pa.Table:
        """The stored rows of `keys` (`columns`, ``key`` among them), one per key held."""
        parts = self._parts()
        if not parts:
            return pa.table({c: pa.nulls(0) for c in columns})
        wanted = pc.unique(keys.cast(pa.uint64()))
        table = self._dataset(parts).to_table(columns=columns, filter=pds.field("key").isin(wanted))
        _, first = np.unique(table["key"].to_numpy(), return_index=True)
        return table.take(pa.array(first))

    def append(self, table: pa.Table) -> None:
        """A new part of rows (a run appends what it encoded)."""
        self.storage.write_parquet(table, join(self.uri, f"part-{uuid.uuid4().hex[:12]}.parquet"))

    def _dataset(self, parts: list[str]) -> pds.Dataset:
        return pds.dataset(parts, filesystem=self.storage.resolve(self.uri).fs, format="parquet")
