"""Encoding a large corpus through a Ray Data actor pool (a thin wrapper over the encoders).

Each actor builds its encoder once (the model loads on the actor) and encodes batches of
documents; rows carry their position so the driver can put embeddings back in corpus order
whatever order blocks finish in. On a GPU cluster set ``gpus_per_actor=1``; on a machine
without a GPU keep it 0 (a GPU request there waits forever instead of failing).

Each actor asks Ray for the host memory its encoder needs (`actor_memory`), so Ray places no
more actors on a node than its memory holds: the runtime, the weights in the spec's dtype
(counted on the meta device: exact, nothing loaded), and, on a CPU, one forward pass's
activations — per token the MLP's intermediate vector and a few hidden-sized ones (attention
runs PyTorch's fused kernels, which keep no length² scores), and SPLADE's vocabulary logits —
plus a batch's rows. On a GPU the forward pass is in GPU memory, not counted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from cpr_ray.retrieval.encoder import DenseEncoder, SpladeEncoder
from cpr_ray.retrieval.model_source import locate
from cpr_ray.retrieval.spec import EncoderSpec, RayEncodeOptions
from cpr_ray.storage.store import Storage, StorageConfig, join

if TYPE_CHECKING:
    import ray

Kind = Literal["dense", "splade"]
# an actor's Python, Ray, torch and transformers, and their first forward pass's allocations:
# a process encoding 256 texts with MiniLM peaked at 785 MiB (VmHWM) in batches of 32 texts of
# 256 tokens, at 1109 MiB in batches of 128 of 512 tokens (`actor_memory`: 953 and 1627 MiB)
RUNTIME_BYTES = 768 << 20
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
HIDDEN_COPIES = 4  # hidden-sized vectors a token holds at once in a layer, besides the MLP's
ROW_BYTES_PER_TOKEN = 32  # a row's text, its tokens and their tensors (ids, mask, types)
DEFAULT_POOL = RayEncodeOptions()  # the `encoder:` section's defaults


# what an encoder actor writing its vectors to storage returns per batch (see PartsTarget)
PART_RECORD = pa.schema(
    [("uri", pa.string()), ("lo", pa.int64()), ("hi", pa.int64()), ("rows", pa.int64())]
)


@dataclass(frozen=True)
class PartsTarget:
    """Where encoder actors write dense vectors themselves instead of returning them: each batch
    of (`id`, `text`) rows becomes ``{folder}/part-{first id}.parquet`` of (`id`, `embedding`),
    and only its record (uri, lo and hi id, rows) goes on, so the vectors reach storage without
    passing through the object store or the driver. A retried batch rewrites the same part."""

    storage: StorageConfig
    folder: str


def write_part(storage: Storage, folder: str, encoded: pa.Table) -> pa.Table:
    """Write one encoded batch as a part under `folder`; returns its PART_RECORD row."""
    ids = encoded["id"]
    lo, hi = pc.min(ids).as_py(), pc.max(ids).as_py()
    uri = join(folder, f"part-{lo:020d}.parquet")
    storage.write_parquet(encoded.select(["id", "embedding"]), uri)
    return pa.Table.from_pylist(
        [{"uri": uri, "lo": lo, "hi": hi, "rows": encoded.num_rows}], schema=PART_RECORD
    )


class EncodeDocs:
    """Callable class for map_batches: a `text` column -> `embedding` (dense, fixed-size list of
    float32) or `indices`/`values` (SPLADE, the nonzero vocabulary entries); every other column
    (a row position, an id, a content key) passes through, so the caller can store or reorder
    the output without a join. With `parts` (dense only), the actor writes the batch's vectors
    to storage and returns only where they went."""

    def __init__(self, spec: EncoderSpec, kind: Kind, parts: PartsTarget | None = None) -> None:
        if parts is not None and kind != "dense":
            raise ValueError("only dense vectors are written as parts")
        self.kind = kind
        self.parts = parts
        self.storage = Storage(parts.storage) if parts else None  # one S3 client per actor
        self.encoder = DenseEncoder(spec) if kind == "dense" else SpladeEncoder(spec)

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column("text").to_pylist()
        rest = batch.drop_columns(["text"])
        if isinstance(self.encoder, DenseEncoder):  # kind "dense"
            emb = self.encoder.encode_docs(texts)  # (b, d)
            flat = pa.array(emb.reshape(-1), type=pa.float32())
            encoded = rest.append_column(
                "embedding", pa.FixedSizeListArray.from_arrays(flat, self.encoder.dim)
            )
            if self.parts is None or self.storage is None:
                return encoded
            if not encoded.num_rows:
                return PART_RECORD.empty_table()
            return write_part(self.storage, self.parts.folder, encoded)
        mat = self.encoder.encode_docs(texts).tocsr()  # (b, V) sparse
        offsets = pa.array(mat.indptr.astype(np.int32))
        indices = pa.ListArray.from_arrays(offsets, pa.array(mat.indices.astype(np.int32)))
        values = pa.ListArray.from_arrays(offsets, pa.array(mat.data.astype(np.float32)))
        return rest.append_column("indices", indices).append_column("values", values)


@dataclass(frozen=True)
class Shape:
    """What an encoder's memory depends on, from its transformers config and meta model."""

    parameters: int
    hidden: int
    intermediate: int
    vocab: int


def model_shape(spec: EncoderSpec) -> Shape:
    """The spec's model's `Shape`: its config read, the model built on the meta device."""
    from cpr_ray.retrieval.model_source import meta_model, model_config

    config = model_config(spec)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text.hidden_size)
    model = meta_model(spec, config, spec.model)
    return Shape(
        sum(p.numel() for p in model.parameters()),
        hidden,
        int(getattr(text, "intermediate_size", None) or 4 * hidden),
        int(text.vocab_size),
    )


def actor_memory(shape: Shape, spec: EncoderSpec, kind: Kind, rows: int, on_gpu: bool) -> int:
    """Bytes of host memory an encoder actor needs for calls of `rows` rows: the runtime, the
    weights (on a GPU they pass through host memory as they load), a call's rows and, on a CPU,
    one forward pass of the spec's batch (`batch_size` texts of `max_length` tokens, or the
    `token_budget`'s worth)."""
    size = DTYPE_BYTES[spec.dtype]
    tokens = spec.batch_size * spec.max_length
    if spec.token_budget is not None:  # a text longer than the budget still goes alone
        tokens = min(tokens, max(spec.token_budget, spec.max_length))
    per_token = shape.intermediate + HIDDEN_COPIES * shape.hidden
    if kind == "splade":
        per_token += shape.vocab  # the masked-LM logits, pooled in place
    forward = 0 if on_gpu else tokens * per_token * size
    batch = rows * spec.max_length * ROW_BYTES_PER_TOKEN
    return RUNTIME_BYTES + shape.parameters * size + forward + batch


def encode_dataset(
    ds: ray.data.Dataset,
    spec: EncoderSpec,
    kind: Kind = "dense",
    options: RayEncodeOptions = DEFAULT_POOL,
    *,
    start_all: bool = False,
    parts: PartsTarget | None = None,
) -> ray.data.Dataset:
    """`ds` (a `text` column and any others) encoded on an actor pool, lazily: the caller
    streams the result to storage or gathers it; with `parts`, the actors write the vectors
    to storage themselves and the result is their PART_RECORD rows.

    `start_all` starts every actor at once (`initial_size`): Ray Data's autoscaler otherwise
    starts one and adds the others once a queue has built up, so the second actor's model load
    lands mid-run. Only for input that needs no tasks (blocks already in memory): actors holding
    every CPU from the start starve an upstream read of the CPU it needs, and the pipeline hangs.
    """
    import ray

    # here, on the driver: an actor whose model cannot load is restarted by Ray Data, again and
    # again, where this is one line before any actor starts
    locate(spec)
    memory = actor_memory(
        model_shape(spec), spec, kind, options.batch_rows, on_gpu=options.gpus_per_actor > 0
    )
    return ds.map_batches(
        EncodeDocs,
        fn_constructor_kwargs={"spec": spec, "kind": kind, "parts": parts},
        compute=ray.data.ActorPoolStrategy(
            min_size=1,
            max_size=options.actors,
            initial_size=options.actors if start_all else 1,
        ),
        batch_size=options.batch_rows,
        batch_format="pyarrow",
        memory=memory,
        **options.ray_resources(),
    )


def encode_with_ray(
    texts: Sequence[str],
    spec: EncoderSpec,
    kind: Kind = "dense",
    options: RayEncodeOptions = DEFAULT_POOL,
    vocab_size: int | None = None,
) -> np.ndarray | sp.csr_matrix:
    """Encode `texts` on an actor pool; returns rows in input order (dense array or CSR).

    Blocks are cut from the texts sorted longest first (by characters, as sentence-transformers
    sorts): each actor sorts its own block by tokens, but a block cut from unsorted texts mixes
    lengths, and every batch pads to its longest text (11% of MiniLM's time on 64-text blocks of
    sample abstracts)."""
    import ray

    n = len(texts)
    order = np.argsort(-np.fromiter(map(len, texts), np.int64, n), kind="stable")
    table = pa.table(
        {"row": pa.array(order.astype(np.int64)), "text": pa.array(texts).take(pa.array(order))}
    )
    per_block = max(1, min(options.rows_per_block, -(-n // (4 * options.actors))))
    blocks = [table.slice(s, per_block) for s in range(0, n, per_block)] or [table]
    # a call never spans blocks: joined sorted blocks would give one actor the long texts and
    # another the short ones, where one block per call balances them as actors free up
    options = options.model_copy(update={"batch_rows": min(options.batch_rows, per_block)})
    ds = encode_dataset(ray.data.from_arrow(blocks), spec, kind, options, start_all=True)
    batch: pa.Table  # what iter_batches yields for batch_format="pyarrow"
    if kind == "dense":
        out: np.ndarray | None = None
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            col = batch.column("embedding").combine_chunks()
            dim = col.type.list_size
            emb = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
            if out is None:
                out = np.zeros((n, dim), dtype=np.float32)
            out[batch.column("row").to_numpy()] = emb
        return out if out is not None else np.zeros((0, 0), dtype=np.float32)
    rows, cols, vals = [], [], []
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        idx = batch.column("indices").combine_chunks()
        lengths = pc.list_value_length(idx).to_numpy(zero_copy_only=False)
        rows.append(np.repeat(batch.column("row").to_numpy(), lengths))
        cols.append(idx.flatten().to_numpy())
        vals.append(batch.column("values").combine_chunks().flatten().to_numpy())
    if vocab_size is None:
        raise ValueError("vocab_size is required for sparse encoding")
    return sp.csr_matrix(
        (
            np.concatenate(vals) if vals else np.zeros(0, np.float32),
            (
                np.concatenate(rows) if rows else np.zeros(0, np.int64),
                np.concatenate(cols) if cols else np.zeros(0, np.int32),
            ),
        ),
        shape=(n, vocab_size),
        dtype=np.float32,
    )
