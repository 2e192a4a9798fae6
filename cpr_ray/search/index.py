"""`cpr index`: a corpus encoded on Ray Data's encoder actor pools into sharded faiss indexes.

Layout under the index URI (local or s3://)::

    index.json                 the manifest, written last: a reader sees a whole index or none
    g0001/docs.parquet         one row per document, in vector-id order: vid, corpus_id, title,
                               text, year, field, domain, topics, content_hash
    g0001/shard-00000/…        a VectorIndex's saved form (vectors.parquet + index.json), ids = vid
    g0001/bm25/…               bm25s's files, when search.bm25 is on

Documents are ordered by vector id (the S2 corpus id; for BEIR's string ids, numbers given in
order of first appearance and kept across re-indexes) and cut into shards of
``search.shard_size`` vectors, so a shard's rows are a contiguous run of ``docs.parquet``.

Re-indexing into the same URI is incremental: a document whose text digest and vector id are
unchanged keeps its vector, only new or changed documents are encoded, documents gone from the
corpus are dropped. A new generation folder is written beside the old one and the manifest is
switched to it last, so a killed re-index leaves the previous index whole (its half-written
generation is removed by the next run). Reuse needs the same encoder: a different model (its
files' fingerprint), pooling, prefixes, length or dtype re-encodes everything.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cpr_ray import leases
from cpr_ray.config import Config, SearchConfig
from cpr_ray.errors import ConfigError, InputError, StorageError
from cpr_ray.retrieval.index import factory_for, save_vectors
from cpr_ray.retrieval.ray_encode import RayEncodeOptions, encode_dataset
from cpr_ray.retrieval.spec import EncoderSpec, RetrieverOptions, vector_identity
from cpr_ray.search.documents import Documents, content_hashes, load_documents
from cpr_ray.storage import Storage, join

FORMAT = 1
MANIFEST, DOCS, BM25_DIR = "index.json", "docs.parquet", "bm25"
GENERATION = re.compile(r"g\d{4}")
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

progress_console = Console(stderr=True)


def encoder_record(spec: EncoderSpec) -> dict[str, Any]:
    """What decides the index's vectors and its queries' (device and batch size do not), as the
    manifest keeps it."""
    return {**vector_identity(spec), "query_prefix": spec.query_prefix}


def read_manifest(storage: Storage, uri: str) -> dict[str, Any] | None:
    try:
        manifest = storage.read_json(join(uri, MANIFEST))
    except FileNotFoundError:
        return None
    if manifest.get("format") != FORMAT:
        raise StorageError(
            f"{uri}: index format {manifest.get('format')!r}, this version reads {FORMAT}; "
            "rebuild it with cpr index"
        )
    return manifest


def require_index(storage: Storage, uri: str) -> dict[str, Any]:
    """The manifest of the index at `uri`; none there is the user's mistake (a wrong path, or
    an index never built), one line for `cpr search` and for `cpr serve` before Serve starts."""
    manifest = read_manifest(storage, uri)
    if manifest is None:
        raise StorageError(f"{uri} holds no search index (no index.json): build it with cpr index")
    return manifest


def assign_vids(
    ids: pa.ChunkedArray | pa.Array, previous: pa.Table | None
) -> tuple[np.ndarray, int]:
    """Vector ids: integer corpus ids as they are; string ids numbered in order of appearance,
    the ones the previous index had keeping their numbers. Returns (vids, next free number)."""
    if not pa.types.is_string(ids.type):
        return pc.cast(ids, pa.int64()).to_numpy(), 0
    known: dict[str, int] = {}
    nxt = 0
    if previous is not None and pa.types.is_string(previous.schema.field("corpus_id").type):
        known = dict(zip(previous["corpus_id"].to_pylist(), previous["vid"].to_pylist()))
        nxt = max(known.values(), default=-1) + 1
    out = np.empty(len(ids), dtype=np.int64)
    for i, doc_id in enumerate(ids.to_pylist()):
        vid = known.get(doc_id)
        if vid is None:
            vid = known[doc_id] = nxt
            nxt += 1
        out[i] = vid
    return out, nxt


def reusable(docs: pa.Table, previous: pa.Table | None) -> np.ndarray:
    """Per document, its row in the previous generation whose vector it can keep, else -1."""
    out = np.full(docs.num_rows, -1, dtype=np.int64)
    if previous is None or previous.num_rows == 0:
        return out
    prev_vid = previous["vid"].to_numpy()  # sorted: docs.parquet is in vid order
    vid = docs["vid"].to_numpy()
    at = np.searchsorted(prev_vid, vid).clip(max=len(prev_vid) - 1)
    same = (prev_vid[at] == vid) & (
        previous["content_hash"].to_numpy()[at] == docs["content_hash"].to_numpy()
    )
    out[same] = at[same]
    return out


def _read_vectors(storage: Storage, uri: str, manifest: dict[str, Any]) -> np.ndarray:
    parts = []
    for shard in manifest["shards"]:
        table = storage.read_parquet(join(uri, shard["path"], "vectors.parquet"))
        values = table.column("embedding").combine_chunks().flatten()
        parts.append(values.to_numpy(zero_copy_only=False).reshape(-1, manifest["dim"]))
    return np.concatenate(parts) if parts else np.zeros((0, manifest["dim"]), np.float32)


def encode(texts: pa.Table, spec: EncoderSpec, options: RayEncodeOptions, label: str) -> np.ndarray:
    """Rows (`row`, `text`) encoded on a Ray Data actor pool, with a progress bar on stderr;
    embeddings come back in `row` order."""
    import ray

    n = texts.num_rows
    per_block = max(1, min(options.rows_per_block, -(-n // (4 * options.max_actors))))
    blocks = [texts.slice(s, per_block) for s in range(0, n, per_block)]
    out: np.ndarray | None = None
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("in flight {task.fields[flight]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=progress_console, transient=False) as bar:
        task = bar.add_task(label, total=n, flight=0)
        ds = encode_dataset(ray.data.from_arrow(blocks), spec, "dense", options)
        done = 0
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            col = batch.column("embedding").combine_chunks()
            emb = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, col.type.list_size)
            if out is None:
                out = np.zeros((n, emb.shape[1]), dtype=np.float32)
            out[batch.column("row").to_numpy()] = emb
            done += batch.num_rows
            bar.update(
                task, completed=done, flight=min(options.max_actors, -(-(n - done) // per_block))
            )
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


def _generation(manifest: dict[str, Any] | None) -> int:
    return 1 + (manifest["generation"] if manifest else 0)


def build_index(cfg: Config, storage: Storage | None = None) -> dict[str, Any]:
    """Build or update the index at ``search.out`` from ``search.corpus``; returns its manifest."""
    from cpr_ray.ray_runtime import ensure_ray

    cfg.require("search.corpus", "search.out")
    started = time.perf_counter()
    storage = storage or Storage(cfg.storage)
    out_uri = str(cfg.search.out)
    model = cfg.encoder.model or DEFAULT_MODEL
    spec = RetrieverOptions.from_config(cfg).encoder_spec(model)
    record = encoder_record(spec)
    with leases.reading(storage, str(cfg.search.corpus)):
        docs_in: Documents = load_documents(storage, str(cfg.search.corpus))
    if docs_in.table.num_rows == 0:
        raise InputError(f"{docs_in.uri} holds no documents: nothing to index")
    previous = read_manifest(storage, out_uri)
    prev_docs = None
    reason = "new index"
    if previous is not None:
        if previous["id_type"] != docs_in.id_type:
            raise ConfigError(
                f"{out_uri} indexes {previous['id_type']} ids and {cfg.search.corpus} has "
                f"{docs_in.id_type} ids: give another --out"
            )
        prev_docs = storage.read_parquet(join(out_uri, previous["docs"]))
        reason = "same encoder" if previous["encoder"] == record else "encoder changed"
    table = docs_in.table
    vids, _ = assign_vids(table["corpus_id"], prev_docs)
    table = table.append_column("vid", pa.array(vids, pa.int64()))
    table = table.append_column("content_hash", pa.array(content_hashes(table["text"]), pa.int64()))
    table = table.sort_by("vid")
    keep = reusable(table, prev_docs if reason == "same encoder" else None)
    todo = np.flatnonzero(keep < 0)

    ensure_ray(cfg.ray)
    enc = cfg.encoder
    options = RayEncodeOptions(
        max_actors=enc.actors,
        num_cpus=enc.cpus_per_actor,
        num_gpus=enc.gpus_per_actor,
        resources=dict(enc.resources_per_actor),
    )
    new_vectors = (
        encode(
            pa.table({"row": pa.array(np.arange(len(todo))), "text": table["text"].take(todo)}),
            spec,
            options,
            f"encoding {len(todo):,} of {table.num_rows:,} documents",
        )
        if len(todo)
        else None
    )
    dim = new_vectors.shape[1] if new_vectors is not None else previous["dim"]
    vectors = np.zeros((table.num_rows, dim), dtype=np.float32)
    if (keep >= 0).any():
        old = _read_vectors(storage, out_uri, previous)
        vectors[keep >= 0] = old[keep[keep >= 0]]
    if new_vectors is not None:
        vectors[todo] = new_vectors

    deleted = 0
    if prev_docs is not None:
        kept = np.isin(prev_docs["vid"].to_numpy(), table["vid"].to_numpy())
        deleted = int((~kept).sum())
    build = {
        "reason": reason,
        "encoded": int(len(todo)),
        "reused": int((keep >= 0).sum()),
        "deleted": deleted,
    }
    return publish(
        storage,
        out_uri,
        table,
        vectors,
        cfg.search,
        encoder=record,
        source={"uri": docs_in.uri, "kind": docs_in.kind},
        generation=_generation(previous),
        build={**build, "seconds": round(time.perf_counter() - started, 1)},
    )


def publish(
    storage: Storage,
    out_uri: str,
    table: pa.Table,
    vectors: np.ndarray,
    search: SearchConfig,
    *,
    encoder: dict[str, Any],
    source: dict[str, str],
    generation: int,
    build: dict[str, Any],
) -> dict[str, Any]:
    """Write generation `generation` of the index (documents in vid order, their vectors in the
    same order), then the manifest that points at it, then remove older generations."""
    gen_dir = f"g{generation:04d}"
    storage.delete_dir(join(out_uri, gen_dir))  # what a killed run of this generation left
    size = search.shard_size
    vids = table["vid"].to_numpy()
    shards = []
    for i, start in enumerate(range(0, table.num_rows, size)):
        rows = slice(start, start + size)
        n = min(size, table.num_rows - start)
        factory = factory_for(n, search.ivf_min_vectors)
        path = f"{gen_dir}/shard-{i:05d}"
        save_vectors(
            storage, join(out_uri, path), vids[rows], vectors[rows], factory, nprobe=search.nprobe
        )
        shards.append({"path": path, "rows": n, "factory": factory})
    storage.write_parquet(table, join(out_uri, gen_dir, DOCS))
    bm25 = None
    if search.bm25:
        from cpr_ray.retrieval.bm25 import BM25Retriever

        lexical = BM25Retriever()
        lexical.index(table["text"].to_pylist())
        bm25 = f"{gen_dir}/{BM25_DIR}"
        lexical.save(storage, join(out_uri, bm25))
    id_type = "string" if pa.types.is_string(table.schema.field("corpus_id").type) else "int64"
    manifest = {
        "format": FORMAT,
        "generation": generation,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": source,
        "id_type": id_type,
        "encoder": encoder,
        "dim": int(vectors.shape[1]),
        "metric": "inner_product",
        "n_docs": table.num_rows,
        "docs": f"{gen_dir}/{DOCS}",
        "shards": shards,
        "bm25": bm25,
        "has_fields": table["field"].null_count < table.num_rows,
        "build": build,
    }
    storage.write_json(join(out_uri, MANIFEST), manifest)
    for old_gen in storage.list_dirs(out_uri):
        name = old_gen.rstrip("/").rsplit("/", 1)[-1]
        if GENERATION.fullmatch(name) and name != gen_dir:
            storage.delete_dir(old_gen)
    return manifest


def summary_lines(manifest: dict[str, Any], uri: str) -> list[str]:
    b = manifest["build"]
    shards = manifest["shards"]
    kinds = sorted({s["factory"] for s in shards})
    return [
        f"index → {uri}: {manifest['n_docs']:,} documents ({manifest['source']['kind']} "
        f"{manifest['source']['uri']}), {len(shards)} shard(s) ({', '.join(kinds)}), "
        f"dim {manifest['dim']}, model {manifest['encoder']['model']}"
        + (", BM25 beside it" if manifest["bm25"] else ""),
        f"  {b['encoded']:,} encoded, {b['reused']:,} kept from the previous index, "
        f"{b['deleted']:,} dropped ({b['reason']}) in {b['seconds']:.1f}s",
    ]
