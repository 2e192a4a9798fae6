"""Document vectors of the candidate universe: encoded once, kept across runs, assembled per run.

**The store** is the one vector store (`retrieval.vector_store`), its documents' side: per
pooler encoder, rows of ``corpus_id``, ``key`` (of the paper and the exact text encoded) and the
vector (dense, normalised float32; or SPLADE's nonzero vocabulary weights). A run encodes, on a
Ray Data actor pool, only the universe papers whose key the store lacks, and appends them: a
rerun, or a nightly refresh whose universe grew, pays GPU time for the new or changed texts
only.

**The index** of a run (``RUN/index/{pooler}/``) is its universe's vectors in search order
(`search.Universe`): for dense poolers the saved form of a
:class:`~cpr_ray.retrieval.index.VectorIndex` (flat below ``pooling.ivf_min_docs`` documents,
IVF above) that each search actor loads; for SPLADE ``sparse.parquet``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from math import ceil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from cpr_ray.errors import StorageError
from cpr_ray.pooling.poolers import SPARSE, PoolerPlan
from cpr_ray.pooling.rules import doc_text
from cpr_ray.pooling.search import Universe
from cpr_ray.ray_runtime import read_parquet_dataset
from cpr_ray.retrieval.index import factory_for, save_vectors
from cpr_ray.retrieval.vector_store import VectorStore, text_keys, vector_columns
from cpr_ray.storage import Storage, StorageConfig, join

KEYS = pa.schema([("corpus_id", pa.int64()), ("key", pa.uint64())])


def vector_store(storage: Storage, plan: PoolerPlan) -> VectorStore:
    """Where the pooler's encoder keeps its document vectors, shared by every run of the build."""
    assert plan.spec is not None and plan.kind in ("dense", "splade"), f"{plan.name}: no vectors"
    return VectorStore(storage, plan.spec, plan.kind)


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


def texts_to_encode(batch: pa.Table, template: str, stored: pa.Array) -> pa.Table:
    """(corpus_id, key, text) of the DOCS rows whose key the store does not hold yet."""
    text = doc_text(batch["title"], batch["abstract"], template)
    keys = text_keys(text, batch["corpus_id"])
    table = pa.table({"corpus_id": batch["corpus_id"], "key": keys, "text": text})
    return table.filter(pc.invert(pc.is_in(keys, value_set=stored)))


def gather(ds: ray.data.Dataset, schema: pa.Schema) -> pa.Table:
    """A dataset's (small) output on the driver, as one table of `schema`."""
    tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    return pa.concat_tables(tables).cast(schema) if tables else schema.empty_table()


def encode_missing(
    storage: Storage, plan: PoolerPlan, docs_uri: str, batch_rows: int
) -> tuple[pa.Table, int]:
    """Encode the universe papers the pooler's store lacks; returns (this universe's keys,
    papers encoded now)."""
    # here, not at the top: the stage's tasks (docs snapshot, index assembly) import this module
    # in every Ray worker they run in, and only the encoder actors need torch
    from cpr_ray.retrieval.ray_encode import RayEncodeOptions, encode_dataset

    column = key_column(plan.template)
    keys = storage.read_parquet(docs_uri, ["corpus_id", column]).rename_columns(KEYS.names)
    keys = keys.cast(KEYS)
    store = vector_store(storage, plan)
    stored = store.keys()
    todo = int(pc.sum(pc.invert(pc.is_in(keys["key"], value_set=stored))).as_py() or 0)
    if todo == 0:
        return keys, 0
    # blocks small enough that every actor gets work, at most batch_rows rows per call
    rows = max(1, min(batch_rows, ceil(todo / (2 * plan.actors))))
    loc = storage.resolve(docs_uri)
    docs = read_parquet_dataset(loc.path, filesystem=loc.fs).select_columns(
        ["corpus_id", "title", "abstract"]
    )
    missing = docs.map_batches(
        texts_to_encode,
        fn_kwargs={"template": plan.template, "stored": stored},
        batch_format="pyarrow",
        batch_size=None,
    ).repartition(ceil(todo / rows))
    options = RayEncodeOptions(
        max_actors=plan.actors,
        batch_size=rows,
        num_cpus=plan.num_cpus,
        num_gpus=plan.num_gpus,
        resources=plan.resources,
    )
    encoded = encode_dataset(missing, store.spec, store.kind, options)
    sloc = storage.resolve(store.uri)
    encoded.write_parquet(sloc.path, filesystem=sloc.fs, try_create_dir=not sloc.is_s3)
    return keys, todo


def assemble_index(
    storage_cfg: StorageConfig,
    plan: PoolerPlan,
    docs_uri: str,
    index_uri: str,
    keys: pa.Table,
    ivf_min_docs: int,
    ivf_lists: int | None,
    nprobe: int,
) -> dict[str, object]:
    """Write the pooler's index for this run: the store's vectors of exactly this universe's
    texts (`keys`), in search order. Runs as a Ray task, off the driver."""
    storage = Storage(storage_cfg)
    universe = Universe(storage.read_parquet(docs_uri, ["corpus_id", "date_key", "topic_ids"]))
    store = vector_store(storage, plan)
    columns = ["corpus_id", "key", *vector_columns(plan.kind)]
    table = store.read(keys["key"].combine_chunks(), columns)  # one row per text
    positions = universe.positions(table["corpus_id"].to_numpy())
    if table.num_rows != len(universe) or (positions < 0).any():
        raise StorageError(
            f"embedding store {store.uri} holds {table.num_rows:,} of this universe's "
            f"{len(universe):,} document texts; rerun pool (cpr build --stages pool --force)"
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
    nonzeros = pc.mean(pc.list_value_length(table["indices"])).as_py() or 0.0
    return {"index": "sparse", "documents": table.num_rows, "nonzeros_per_doc": round(nonzeros, 1)}
