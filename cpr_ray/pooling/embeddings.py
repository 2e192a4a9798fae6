"""Document vectors of the candidate universe: encoded once, kept across runs, assembled per run.

**The store** is the one vector store (`retrieval.vector_store`), its documents' side: per
pooler encoder, rows of ``corpus_id``, ``key`` (of the paper and the exact text encoded) and the
vector (dense, normalised float32; or SPLADE's nonzero vocabulary weights). A run encodes, on a
Ray Data actor pool (in one task, when they are one actor call's worth), only the universe
papers whose key the store lacks, and appends them: a
rerun, or a nightly refresh whose universe grew, pays GPU time for the new or changed texts
only.

**The index** of a run is one per shard of its universe (`shards`;
``RUN/index/{pooler}/shard-SSSSS/``): the shard's vectors in search order (`search.Universe`), for
dense poolers the saved form of a :class:`~cpr_ray.retrieval.faiss_index.VectorIndex` (flat below
``pooling.ivf_min_docs`` documents, IVF above), for SPLADE ``sparse.parquet``. Every step is a task
per shard or per part of the store, declaring the memory it needs: finding the texts the store lacks
(`missing_texts`), copying the store's rows to their shards' folders (`route_part`, so a shard reads
its own rows, not the whole store), and assembling a shard's index (`assemble_index`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from math import ceil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from cpr_ray.errors import StorageError
from cpr_ray.pooling.pool_rules import doc_text
from cpr_ray.pooling.pooler_search import Universe
from cpr_ray.pooling.poolers import SPARSE, PoolerPlan
from cpr_ray.pooling.universe_shards import shard_of
from cpr_ray.queries.query_store import query_store
from cpr_ray.retrieval.faiss_index import factory_for, save_vectors
from cpr_ray.retrieval.vector_store import VectorStore, text_keys, vector_columns
from cpr_ray.runs.ray_runtime import read_parquet_dataset
from cpr_ray.sections import derive
from cpr_ray.storage.store import Storage, StorageConfig, join


def vector_store(storage: Storage, plan: PoolerPlan) -> VectorStore:
    """Where the pooler's encoder keeps its document vectors, shared by every run of the build."""
    kind = plan.kind
    assert plan.spec is not None and kind != "bm25", f"{plan.name}: no vectors"
    return VectorStore(storage, plan.spec, kind)


def key_column(template: str) -> str:
    """The DOCS column holding each paper's content key under a document template (the pool
    stage's snapshot writes one per template of its encoding poolers)."""
    return "key_" + hashlib.sha256(template.encode()).hexdigest()[:12]


def with_keys(docs: pa.Table, templates: Sequence[str]) -> pa.Table:
    """DOCS rows with their content key under each template, so that finding what a store lacks
    reads two columns instead of re-deriving every text."""
    for template in dict.fromkeys(templates):
        text = doc_text(docs["title"], docs["abstract"], template)
        docs = docs.append_column(key_column(template), text_keys(text, docs["corpus_id"]))
    return docs


def missing_texts(
    storage_cfg: StorageConfig, plan: PoolerPlan, docs_uri: str, todo_uri: str
) -> int:
    """Write (corpus_id, key, text) of the papers of one shard (`docs_uri`) whose text the
    pooler's store lacks to `todo_uri`; returns how many. A task per shard: it holds its
    shard's papers and streams the store's key column through a filter, never the whole
    universe or store."""
    storage = Storage(storage_cfg)
    docs = storage.read_parquet(
        docs_uri, ["corpus_id", "title", "abstract", key_column(plan.template)]
    )
    keys = docs[key_column(plan.template)].combine_chunks()
    held = vector_store(storage, plan).read(keys, ["key"])["key"].combine_chunks()
    todo = pc.invert(pc.is_in(keys, value_set=held.cast(pa.uint64())))
    docs = docs.filter(todo)
    if docs.num_rows:
        text = doc_text(docs["title"], docs["abstract"], plan.template)
        table = pa.table(
            {"corpus_id": docs["corpus_id"], "key": docs[key_column(plan.template)], "text": text}
        )
        storage.write_parquet(table, todo_uri)
    return docs.num_rows


def encode_missing(
    storage: Storage,
    plan: PoolerPlan,
    todo_uri: str,
    todo: int,
    batch_rows: int,
    queries: pa.Table | None = None,
) -> None:
    """Encode the `todo` texts under `todo_uri` (`missing_texts`' parts) and append their
    vectors to the pooler's store: on an actor pool, or, when they fit one call of an actor
    (`batch_rows`), in one Ray task with the actor's resources. A nightly refresh's universe
    gains a few dozen texts at a small corpus (117 at 40k papers): the pool's start, Ray Data's
    executor and a second actor's model load cost ~17 s of a 64 CPU-s refresh there, for a
    forward pass of milliseconds; the task loads the model once. `queries` (a dense pooler's
    `query_vectors.missing_queries`: key, text) are encoded in that same task, so a run loads
    the model once for both, and its search actors none."""
    # here, not at the top: the stage's tasks (docs snapshot, index assembly) import this module
    # in every Ray worker they run in, and only the encoder actors need torch
    from cpr_ray.retrieval.ray_encode import actor_memory, encode_dataset, locate, model_shape
    from cpr_ray.retrieval.spec import RayEncodeOptions

    store = vector_store(storage, plan)
    asked = queries if queries is not None and queries.num_rows else None
    if todo > batch_rows:
        # blocks small enough that every actor gets work, at most batch_rows rows per call
        rows = max(1, min(batch_rows, ceil(todo / (2 * plan.pool.actors))))
        loc = storage.resolve(todo_uri)
        missing = read_parquet_dataset(loc.path, filesystem=loc.fs).repartition(ceil(todo / rows))
        options = derive(RayEncodeOptions, plan.pool, batch_rows=rows)
        encoded = encode_dataset(missing, store.spec, store.kind, options)
        sloc = storage.resolve(store.uri)
        encoded.write_parquet(sloc.path, filesystem=sloc.fs, try_create_dir=not sloc.is_s3)
        todo = 0  # the queries are left, for the task below
    if not todo and asked is None:
        return
    import ray

    locate(store.spec)  # a model that cannot load: one line here, not a task's traceback
    rows = max(todo, asked.num_rows if asked is not None else 0)
    shape = model_shape(store.spec)
    on_gpu = plan.pool.gpus_per_actor > 0
    memory = actor_memory(shape, store.spec, store.kind, rows, on_gpu=on_gpu)
    task = ray.remote(_encode_in_task).options(memory=memory, **plan.pool.ray_resources())
    ray.get(task.remote(storage.cfg, plan, todo_uri if todo else None, asked))


def _encode_in_task(
    storage_cfg: StorageConfig, plan: PoolerPlan, todo_uri: str | None, queries: pa.Table | None
) -> None:
    """One task's share of `encode_missing`: the todo texts under `todo_uri` encoded as an
    actor's call would (`EncodeDocs`) and appended to the document store as one part, and the
    `queries` (key, text) encoded as queries (the query prefix) and appended to the pooler's
    query store, with one model load."""
    from cpr_ray.retrieval.encoder import DenseEncoder
    from cpr_ray.retrieval.ray_encode import EncodeDocs

    storage = Storage(storage_cfg)
    store = vector_store(storage, plan)
    encode = EncodeDocs(store.spec, store.kind)
    if todo_uri is not None:
        loc = storage.resolve(todo_uri)
        todo = pds.dataset(loc.path, filesystem=loc.fs, format="parquet").to_table()
        store.append(encode(todo))
    if queries is not None:
        assert isinstance(encode.encoder, DenseEncoder)  # only dense poolers store queries
        assert plan.spec is not None
        vectors = encode.encoder.encode_queries(queries["text"].to_pylist())
        flat = pa.array(vectors.reshape(-1), pa.float32())
        embedding = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
        query_store(storage, plan.spec).append(
            pa.table({"key": queries["key"], "embedding": embedding})
        )


def store_parts(storage: Storage, plan: PoolerPlan) -> list[tuple[str, int]]:
    """(uri, bytes) of every Parquet part of the pooler's store."""
    store = vector_store(storage, plan)
    root = storage.resolve(store.uri).path.rstrip("/")
    return [
        (join(store.uri, f.path[len(root) :].lstrip("/")), f.size)
        for f in storage.list_files(store.uri, (".parquet",), missing_ok=True)
    ]


def route_part(
    storage_cfg: StorageConfig, kind: str, part_uri: str, out_uri: str, shards: int
) -> np.ndarray:
    """Copy one part of a store into a folder per shard (``out_uri/shard-SSSSS/``), each row to
    its paper's shard, so that a shard's index reads its own rows rather than the whole store.
    Returns (shards, 2): rows and Arrow bytes of the vectors written per shard."""
    storage = Storage(storage_cfg)
    table = storage.read_parquet(part_uri, ["corpus_id", "key", *vector_columns(kind)])
    shard = shard_of(table["corpus_id"].to_numpy(), shards)
    name = part_uri.rsplit("/", 1)[-1]
    out = np.zeros((shards, 2), np.int64)
    for s in np.unique(shard):
        rows = table.filter(pa.array(shard == s))
        storage.write_parquet(rows, join(out_uri, f"shard-{s:05d}", name))
        out[s] = rows.num_rows, rows.select(vector_columns(kind)).nbytes
    return out


def assemble_index(
    storage_cfg: StorageConfig,
    plan: PoolerPlan,
    docs_uri: str,
    vectors_uri: str | None,
    index_uri: str,
    ivf_min_docs: int,
    ivf_lists: int | None,
    nprobe: int,
) -> dict[str, object]:
    """Write the index of one shard for this run: the vectors of exactly its papers' texts (the
    keys in `docs_uri`, from the shard's rows of the store under `vectors_uri`, or, with None,
    from the store itself: a refresh's few added papers), in search order. Runs as a Ray task,
    off the driver, declaring the memory of one shard."""
    storage = Storage(storage_cfg)
    column = key_column(plan.template)
    docs = storage.read_parquet(docs_uri, ["corpus_id", "date_key", "topic_ids", column])
    universe = Universe(docs)
    columns = ["corpus_id", "key", *vector_columns(plan.kind)]
    keys = docs[column].combine_chunks()
    table, positions = None, None
    if vectors_uri is None:
        table = vector_store(storage, plan).read(keys, columns)
    elif storage.exists(vectors_uri):
        table = storage.read_parquet(vectors_uri, columns)
    if table is not None and table.num_rows:
        table = table.filter(pc.is_in(table["key"], value_set=keys))
        _, first = np.unique(table["key"].to_numpy(), return_index=True)
        table = table.take(pa.array(first))  # one row per text
        positions = universe.positions(table["corpus_id"].to_numpy())
    if (
        table is None
        or positions is None  # (set with the table)
        or table.num_rows != len(universe)
        or np.any(positions < 0)
    ):
        raise StorageError(
            f"embedding store {vector_store(storage, plan).uri} holds "
            f"{0 if table is None else table.num_rows:,} of {len(universe):,} document texts "
            "of a shard of this universe; rerun pool (cpr build --stages pool --force)"
        )
    table = table.take(pa.array(np.argsort(positions)))
    if plan.kind == "dense":
        column = table["embedding"].combine_chunks()
        dim = column.type.list_size
        vectors = column.flatten().to_numpy().reshape(-1, dim)
        factory = factory_for(len(vectors), ivf_min_docs, ivf_lists)
        save_vectors(
            storage, index_uri, table["corpus_id"].to_numpy(), vectors, factory, nprobe=nprobe
        )
        return {"index": factory, "documents": len(vectors), "dim": dim}
    storage.write_parquet(table.select(["corpus_id", "indices", "values"]), join(index_uri, SPARSE))
    nonzeros = pc.sum(pc.list_value_length(table["indices"])).as_py() or 0
    return {"index": "sparse", "documents": table.num_rows, "nonzeros": int(nonzeros)}
