"""The poolers as Ray steps: a plain plan per pooler (from `pooling.poolers`), and the search
actor that turns batches of queries into one pooler's ranked lists.

The plan is what travels to actors (plain values, an :class:`EncoderSpec`), so an actor loads its
model and index where it runs, never on the driver. A search actor loads its query encoder once
(SPLADE; a dense pooler's query vectors come from the store, `query_vectors`), and one shard
of the universe at a time with that shard's index (dense: a faiss
:class:`VectorIndex` on the GPU when it has one; SPLADE: the sparse matrix, transposed for
query-by-corpus products; BM25: a bm25s index of the shard's texts built with the whole
universe's statistics, so its scores are those of one index over the universe), and answers
SEARCH_QUERIES batches with that shard's SHARD_HITS (`shards`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from cpr_ray.config import EncoderActors, PoolingConfig
from cpr_ray.pooling.pool_rules import doc_text
from cpr_ray.pooling.pool_schemas import SHARD_HITS
from cpr_ray.pooling.pooler_search import Hits, QueryBatch, Universe, exact_hits, index_hits
from cpr_ray.pooling.query_vectors import query_vectors
from cpr_ray.pooling.universe_shards import shard_hits
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.retrieval.vector_store import store_key
from cpr_ray.sections import derive
from cpr_ray.storage.store import Storage, StorageConfig, join

if TYPE_CHECKING:
    from cpr_ray.retrieval.encoder import SpladeEncoder

BLOCK_CELLS = 1 << 24  # query x document scores an exact search holds at once (64 MiB float32)
SPARSE = "sparse.parquet"


@dataclass(frozen=True)
class PoolerPlan:
    """One configured pooler with the resources its encoder and search actors reserve."""

    name: str
    kind: Literal["dense", "splade", "bm25"]
    template: str  # document text from {title} and {abstract}
    spec: EncoderSpec | None  # None for bm25
    # its encoder actors (the pooler's `encoder:` section's); its search actors reserve the
    # same CPUs and GPUs
    pool: EncoderActors

    @property
    def store_key(self) -> str:
        """The key of its vector store: poolers that differ only in query settings share one."""
        kind = self.kind
        assert self.spec is not None and kind != "bm25", f"{self.name}: keeps no vectors"
        return store_key(self.spec, kind)


def plans(cfg: PoolingConfig) -> list[PoolerPlan]:
    """The configured poolers, in round-robin order."""
    out = []
    for i, p in enumerate(cfg.poolers):
        enc = p.encoder
        spec = None
        if enc is not None and enc.model is not None:
            spec = EncoderSpec.from_config(
                enc,
                threads=max(1, int(enc.cpus_per_actor)),  # one torch thread per reserved CPU
                token_budget=cfg.token_budget,
                setting=f"pooling.poolers[{i}].encoder.model (pooler {p.name})",
            )
        out.append(
            PoolerPlan(
                name=p.name,
                kind=p.kind,
                template=p.doc_template,
                spec=spec,
                pool=derive(EncoderActors, enc) if enc else EncoderActors(actors=1),
            )
        )
    return out


def sparse_rows(table: pa.Table, dim: int) -> sp.csr_matrix:
    """CSR (rows, dim) from list columns `indices` (int32) and `values` (float32)."""
    indices = table["indices"].combine_chunks()
    values = table["values"].combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(indices), 0).to_numpy()
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    return sp.csr_matrix(
        (pc.list_flatten(values).to_numpy(), pc.list_flatten(indices).to_numpy(), indptr),
        shape=(len(lengths), dim),
        dtype=np.float32,
    )


class PoolerSearch:
    """A pooler's search actor: SEARCH_QUERIES -> SHARD_HITS of the shard it holds.

    It loads the pooler's query encoder once (SPLADE; dense: its vectors from the store) and one
    shard at a time (`load`): the shard's papers (DOCS parts) and their index (for BM25, the
    universe's statistics to index the shard's texts with). Lists are ranked by score, then
    search order, so that `shards.merge_hits` merges several shards' lists into the lists one
    index over the whole universe gives."""

    def __init__(
        self,
        plan: PoolerPlan,
        storage: StorageConfig,
        docs_uris: str | Sequence[str],
        index_uri: str | None,
    ) -> None:
        if plan.kind == "dense" and plan.pool.gpus_per_actor:
            from cpr_ray.retrieval.faiss_index import faiss_gpus

            faiss_gpus()  # asked Ray for a GPU to search on: refuse to start without one
        self.plan, self.storage = plan, Storage(storage)
        # query vectors by block (first id, last id, rows): every shard sees the same blocks,
        # so each is encoded (SPLADE) or read (dense) once per pass, not once per shard
        self._encoded: dict[tuple[str, str, int], Any] = {}
        # a dense pooler's query vectors come from the store (`query_vectors`): no model here
        self.encoder: SpladeEncoder
        if plan.kind == "splade":
            from cpr_ray.retrieval.encoder import SpladeEncoder

            assert plan.spec is not None
            self.encoder = SpladeEncoder(plan.spec)
        self.load(docs_uris, index_uri)

    def load(self, docs_uris: str | Sequence[str], index_uri: str | None) -> None:
        """Hold this shard (its papers and index) instead of the one held before."""
        plan, st = self.plan, self.storage
        lexical = plan.kind == "bm25"
        columns = ["corpus_id", "date_key", "topic_ids"] + (
            ["title", "abstract"] if lexical else []
        )
        uris = [docs_uris] if isinstance(docs_uris, str) else list(docs_uris)
        docs = pa.concat_tables([st.read_parquet(u, columns) for u in uris])
        self.index = self._docs_t = self.bm25 = None  # the shard before, freed first
        self.universe = Universe(docs)
        if plan.kind == "dense":
            from cpr_ray.retrieval.faiss_index import VectorIndex

            # an actor that asked Ray for a GPU searches on it, or refuses to start (a CPU
            # faiss build would search on the CPU without a word)
            assert index_uri is not None  # a vector pooler's shard comes with its index
            self.index = VectorIndex.load(
                st, index_uri, device="cuda" if plan.pool.gpus_per_actor else "cpu"
            )
            self._check_order(index_uri, self.index.ids)
        elif plan.kind == "splade":
            assert index_uri is not None
            table = st.read_parquet(join(index_uri, SPARSE))
            self._check_order(index_uri, table["corpus_id"].to_numpy())
            self._docs_t = sparse_rows(table, self.encoder.dim).T.tocsr()  # (V, N)
        else:
            from cpr_ray.retrieval.bm25 import BM25Retriever, CollectionStats, EmptyVocabulary

            ordered = docs.take(pa.array(self.universe.order))
            texts = doc_text(ordered["title"], ordered["abstract"], plan.template)
            # the universe's statistics; none when this shard is the whole universe
            stats = CollectionStats.from_dict(st.read_json(index_uri)) if index_uri else None
            self.bm25 = BM25Retriever()
            try:
                self.bm25.index(texts.to_pylist(), stats)
            except EmptyVocabulary:  # every paper here scores 0, so this shard brings none
                self.bm25 = None

    def _check_order(self, uri: str | None, ids: np.ndarray) -> None:
        if not np.array_equal(ids, self.universe.corpus_ids):
            raise ValueError(f"{uri}: index vectors are not this universe's, in search order")

    def search(self, batch: pa.Table) -> pa.Table:
        """The held shard's lists for a block of queries (the actor's remote method)."""
        return self(batch)

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = len(self.universe)
        if n == 0 or batch.num_rows == 0:
            return SHARD_HITS.empty_table()
        if self.plan.kind == "dense":
            queries = self._queries(batch)  # (c, d)
            assert self.index is not None  # load() holds a dense shard's index
            hits = index_hits(
                self.index, self.universe, queries, QueryBatch.build(self.universe, batch)
            )
            return self._table(batch, hits)
        step = max(1, BLOCK_CELLS // n)  # exact scores: a (step, N) block at a time
        parts = []
        for s in range(0, batch.num_rows, step):
            chunk = batch.slice(s, step)
            scores = self._scores(chunk)  # (c, N)
            hits = exact_hits(scores, QueryBatch.build(self.universe, chunk), positive_only=True)
            parts.append(self._table(chunk, hits))
        return pa.concat_tables(parts)

    def _queries(self, batch: pa.Table) -> Any:
        ids = batch["query_id"]
        key = (ids[0].as_py(), ids[-1].as_py(), batch.num_rows)
        if key not in self._encoded:
            texts = batch["query"].to_pylist()
            self._encoded[key] = (
                query_vectors(self.storage, self.plan.spec, texts)
                if self.plan.kind == "dense" and self.plan.spec is not None
                else self.encoder.encode_queries(texts)
            )
        return self._encoded[key]

    def _scores(self, batch: pa.Table) -> np.ndarray:
        if self.plan.kind == "splade":
            product = self._queries(batch) @ self._docs_t  # (c, N) sparse
            return np.asarray(product.todense(), dtype=np.float32)
        if self.bm25 is None:
            return np.zeros((batch.num_rows, len(self.universe)), dtype=np.float32)
        return self.bm25.scores(batch["query"].to_pylist())

    def _table(self, batch: pa.Table, hits: Hits) -> pa.Table:
        return shard_hits(batch, self.universe, hits, self.plan.name)
