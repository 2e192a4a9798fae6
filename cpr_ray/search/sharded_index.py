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

No vector passes through the driver whole. The encoder actors (on the cluster profile, GPU
workers) write each batch's vectors to ``gNNNN/encoded/part-….parquet`` (id, embedding) and
return only where they went; each shard's ``vectors.parquet`` is then written
``CHUNK_ROWS`` vectors at a time (one row group each), gathered from the parts and from the
row groups of the previous generation's shards that hold the vectors kept, and the parts are
removed. The driver holds the documents' table (ids, text, metadata: what ``docs.parquet``
holds) and one chunk of vectors. A faiss index is built whole per shard where it is searched
(``cpr search``, ``cpr serve``: ``VectorIndex.load``), from that shard's vectors.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cpr_ray.config import Config, SearchConfig
from cpr_ray.errors import ConfigError, InputError, StorageError
from cpr_ray.retrieval.faiss_index import VECTORS, factory_for, save_vector_chunks
from cpr_ray.retrieval.model_source import locate
from cpr_ray.retrieval.ray_encode import PartsTarget, encode_dataset
from cpr_ray.retrieval.spec import EncoderSpec, RayEncodeOptions, RetrieverOptions, query_identity
from cpr_ray.search.documents import Documents, content_hashes, load_documents
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, join

FORMAT = 1
MANIFEST, DOCS, BM25_DIR = "index.json", "docs.parquet", "bm25"
PARTS = "encoded"  # the encoder actors' parts, inside the generation being built
CHUNK_ROWS = 32_768  # vectors assembled and written at a time (a shard's row group)
GENERATION = re.compile(r"g\d{4}")
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

progress_console = Console(stderr=True)


def read_manifest(storage: Storage, uri: str) -> dict[str, Any] | None:
    try:
        manifest = storage.read_json(join(uri, MANIFEST))
    except FileNotFoundError:
        return None
    except ValueError:  # not JSON, or not an object: a file of something else
        manifest = None
    if not isinstance(manifest, dict):
        raise StorageError(
            f"{uri}: its {MANIFEST} is not an index manifest; rebuild it with cpr index"
        )
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


@dataclass(frozen=True)
class Piece:
    """Stored vectors of ids `lo`..`hi`: a whole Parquet file of (`id`, `embedding`) (an encoder
    actor's part), or one row group of one (a shard's ``vectors.parquet``)."""

    uri: str
    lo: int
    hi: int
    row_group: int | None = None


def shard_pieces(storage: Storage, uri: str) -> list[Piece]:
    """The row groups of a saved shard (ids ascending), from its footer's id statistics
    (pyarrow writes them): a later build reads only those holding the ids it keeps."""
    meta = storage.parquet_file(uri).metadata
    column = meta.schema.names.index("id")
    stats = [meta.row_group(i).column(column).statistics for i in range(meta.num_row_groups)]
    return [Piece(uri, int(s.min), int(s.max), i) for i, s in enumerate(stats)]


class StoredVectors:
    """The vectors of a generation's documents (`vids`, ascending) read a run of rows at a time:
    rows marked `kept` from the previous generation's shards (`old`), the others from the
    encoder actors' parts (`new`). Only the pieces a run overlaps are read and held, so
    assembling an index of any size holds one run and a few pieces, never every vector."""

    def __init__(
        self,
        storage: Storage,
        vids: np.ndarray,
        kept: np.ndarray,
        old: list[Piece],
        new: list[Piece],
        dim: int,
    ) -> None:
        self.storage, self.vids, self.kept, self.dim = storage, vids, kept, dim
        # each source's pieces by id (they do not overlap), with their bounds for a bisection
        self.sources = []
        for pieces in (old, new):
            pieces = sorted(pieces, key=lambda p: p.lo)
            bounds = np.array([(p.lo, p.hi) for p in pieces], dtype=np.int64).reshape(-1, 2)
            self.sources.append((pieces, bounds[:, 0], bounds[:, 1]))
        # the pieces read and held now: those the last run overlapped
        self.held: dict[Piece, tuple[np.ndarray, np.ndarray]] = {}

    def _read(self, piece: Piece) -> tuple[np.ndarray, np.ndarray]:
        """(ids ascending, their vectors) of a piece, held until a run past it is asked for."""
        if piece not in self.held:
            if piece.row_group is None:
                table = self.storage.read_parquet(piece.uri, ["id", "embedding"])
            else:
                file = self.storage.parquet_file(piece.uri)
                table = file.read_row_group(piece.row_group, columns=["id", "embedding"])
            ids = table["id"].to_numpy()
            vectors = table["embedding"].combine_chunks().flatten().to_numpy()
            order = np.argsort(ids, kind="stable")
            self.held[piece] = ids[order], vectors.reshape(len(ids), self.dim)[order]
        return self.held[piece]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Vectors of rows start..stop (float32, (stop - start, dim))."""
        vids = self.vids[start:stop]
        out = np.empty((len(vids), self.dim), dtype=np.float32)
        self.held = {p: v for p, v in self.held.items() if p.hi >= vids[0]}  # runs ascend
        for wanted, (pieces, los, his) in zip(
            (self.kept[start:stop], ~self.kept[start:stop]), self.sources
        ):
            at = np.flatnonzero(wanted)
            if not len(at):
                continue
            first = np.searchsorted(his, vids[at[0]])  # the first piece reaching the run
            last = np.searchsorted(los, vids[at[-1]], side="right")  # past the last in it
            found = np.zeros(len(at), dtype=bool)
            for piece in pieces[first:last]:
                ids, vectors = self._read(piece)
                pos = np.searchsorted(ids, vids[at]).clip(max=len(ids) - 1)
                hit = ids[pos] == vids[at]
                out[at[hit]] = vectors[pos[hit]]
                found |= hit
            if not found.all():
                raise StorageError(
                    f"{(~found).sum():,} vector(s) of ids {vids[at[~found]][:3].tolist()}… are in "
                    "no stored part: rebuild the index with cpr index"
                )
        return out


def encode_to_parts(
    todo: pa.Table, spec: EncoderSpec, options: RayEncodeOptions, parts: PartsTarget, label: str
) -> list[Piece]:
    """Rows (`id`, `text`, ids ascending) encoded on a Ray Data actor pool whose actors write
    the vectors to `parts` themselves, with a progress bar on stderr; the driver sees only each
    part's record."""
    import ray

    n = todo.num_rows
    per_block = max(1, min(options.rows_per_block, -(-n // (4 * options.actors))))
    blocks = [todo.slice(s, per_block) for s in range(0, n, per_block)]
    pieces = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("in flight {task.fields[flight]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=progress_console, transient=False) as bar:
        task = bar.add_task(label, total=n, flight=0)
        ds = encode_dataset(ray.data.from_arrow(blocks), spec, "dense", options, parts=parts)
        done = 0
        batch: pa.Table  # what iter_batches yields for batch_format="pyarrow"
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            for record in batch.to_pylist():
                pieces.append(Piece(record["uri"], record["lo"], record["hi"]))
                done += record["rows"]
            bar.update(
                task, completed=done, flight=min(options.actors, -(-(n - done) // per_block))
            )
    if done != n:
        raise StorageError(f"the encoder actors stored {done:,} of {n:,} vectors")
    return pieces


def _generation(manifest: dict[str, Any] | None) -> int:
    return 1 + (manifest["generation"] if manifest else 0)


def build_index(cfg: Config, storage: Storage | None = None) -> dict[str, Any]:
    """Build or update the index at ``search.out`` from ``search.corpus``; returns its manifest."""
    from cpr_ray.runs.ray_runtime import ensure_ray

    cfg.require("search.corpus", "search.out")
    started = time.perf_counter()
    storage = storage or Storage(cfg.storage)
    out_uri = str(cfg.search.out)
    model = cfg.encoder.model or DEFAULT_MODEL
    options = RetrieverOptions.from_config(cfg)  # the encoder and the actors it runs on
    spec = options.encoder_spec(model)
    with leases.reading(storage, str(cfg.search.corpus)):
        docs_in: Documents = load_documents(storage, str(cfg.search.corpus))
    if docs_in.table.num_rows == 0:
        raise InputError(f"{docs_in.uri} holds no documents: nothing to index")
    locate(spec)  # before Ray starts: a typo is one line at once
    # what decides the index's vectors and its queries' (device and batch size do not)
    record = query_identity(spec)
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

    generation = _generation(previous)
    gen_dir = join(out_uri, f"g{generation:04d}")
    storage.delete_dir(gen_dir)  # what a killed run of this generation left
    new: list[Piece] = []
    if len(todo):  # Ray only to encode: an index with nothing new is published without it
        ensure_ray(cfg.ray)
        target = PartsTarget(cfg.storage, join(gen_dir, PARTS))
        todo_rows = pa.table({"id": table["vid"].take(todo), "text": table["text"].take(todo)})
        label = f"encoding {len(todo):,} of {table.num_rows:,} documents"
        new = encode_to_parts(todo_rows, spec, options.ray, target, label)
        first = storage.parquet_file(new[0].uri).schema_arrow.field("embedding")
        dim = first.type.list_size
    else:
        # nothing to encode: every document is reused, so a previous generation exists
        assert previous is not None
        dim = previous["dim"]
    old = []
    if (keep >= 0).any():
        assert previous is not None  # only a previous generation's vectors are reused
        for shard in previous["shards"]:
            old += shard_pieces(storage, join(out_uri, shard["path"], VECTORS))
    vectors = StoredVectors(storage, table["vid"].to_numpy(), keep >= 0, old, new, dim)

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
    manifest = publish(
        storage,
        out_uri,
        table,
        vectors,
        cfg.search,
        encoder=record,
        source={"uri": docs_in.uri, "kind": docs_in.kind},
        generation=generation,
        build={**build, "seconds": round(time.perf_counter() - started, 1)},
    )
    storage.delete_dir(join(gen_dir, PARTS))  # every vector is in a shard now
    return manifest


def publish(
    storage: Storage,
    out_uri: str,
    table: pa.Table,
    vectors: np.ndarray | StoredVectors,
    search: SearchConfig,
    *,
    encoder: dict[str, Any],
    source: dict[str, str],
    generation: int,
    build: dict[str, Any],
) -> dict[str, Any]:
    """Write generation `generation` of the index (documents in vid order, their vectors in the
    same order: an array, or stored vectors read CHUNK_ROWS at a time), then the manifest that
    points at it, then remove older generations."""
    gen_dir = f"g{generation:04d}"
    if isinstance(vectors, np.ndarray):
        dim, rows = int(vectors.shape[1]), lambda a, b: vectors[a:b]
    else:
        dim, rows = vectors.dim, vectors.rows
    size = search.shard_size
    vids = table["vid"].to_numpy()
    shards = []
    for i, start in enumerate(range(0, table.num_rows, size)):
        end = min(start + size, table.num_rows)
        factory = factory_for(end - start, search.ivf_min_vectors)
        path = f"{gen_dir}/shard-{i:05d}"
        chunks = (
            (vids[a : min(a + CHUNK_ROWS, end)], rows(a, min(a + CHUNK_ROWS, end)))
            for a in range(start, end, CHUNK_ROWS)
        )
        save_vector_chunks(storage, join(out_uri, path), chunks, dim, factory, nprobe=search.nprobe)
        shards.append({"path": path, "rows": end - start, "factory": factory})
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
        "dim": dim,
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
