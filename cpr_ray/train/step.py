"""One optimiser step of contrastive training, the same in one process and on many workers.

A worker's share of the global batch goes through the encoder in one of two ways:

- **plain**: queries and documents in one forward call (two tokenised groups, each padded to
  its own longest text) and one backward;
- **gradient cache** (GradCache, Gao et al. 2021), when the worker's texts exceed
  ``chunk_size``: embeddings of every chunk without a graph, the loss over the whole batch and
  its gradient with respect to the embeddings, then each chunk again with a graph, its
  embeddings' gradient pushed through. Memory is one chunk's activations; the loss still sees
  every document of the global batch, which plain gradient accumulation would split into
  smaller batches with fewer negatives. Each chunk replays the random state of its first pass,
  so dropout masks match and the gradients are those of the plain step.

DDP expects one forward per backward, so the module DDP wraps (:class:`Towers`) takes a list of
tokenised groups; in the cache's replay every chunk but the last runs under ``no_sync``.

Workers differ in real hard negatives, hence in texts, but all take the same way: the plain
step and the cache reach their collectives in different orders (DDP's buffer broadcast comes
before the loss's gather in one, after it in the other), so workers that chose differently
would wait on each other for ever. The cache is used when the worker with the most texts
needs it.

Sharded (FSDP2, ``sharding.py``), every forward and backward of a sharded module gathers its
parameters from all workers, so all workers must also run as many chunks: a worker with fewer
runs padding chunks whose gradient is zero. Both passes go through the sharded root, whose
hooks gather the parameters outside the blocks. In the replay every chunk's gradients are
reduced and summed into the sharded ones, with no ``no_sync``: deferring the reduction would
hold the whole model's unsharded gradients on every worker until the last chunk, the memory
sharding is there to save.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from cpr_ray.config import TrainConfig
from cpr_ray.retrieval.encoder import Encoder
from cpr_ray.sections import derive
from cpr_ray.train.loss import InfoNCELoss, LossOutput

PAD_KEY = -1  # document key of an empty negative slot (masked out, whatever its value)


class Towers(nn.Module):
    """Several tokenised groups through the one encoder in a single forward call."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, groups: Sequence[Mapping[str, torch.Tensor]]) -> list[torch.Tensor]:
        return [self.encoder(g) for g in groups]


def freeze_unused(encoder: Encoder) -> None:
    """Stop gradients on parameters the pooled embedding never uses (BERT's pooler head):
    DDP fails on its second step over parameters that get no gradient."""
    for name, param in encoder.named_parameters():
        if ".pooler." in f".{name}":
            param.requires_grad_(False)


@dataclass(frozen=True)
class Batch:
    """One worker's part of a global batch: b queries, each with up to k hard negatives."""

    queries: list[str]
    positives: list[str]
    negatives: list[list[str]]
    positive_keys: np.ndarray  # (b,) int64 document keys
    negative_keys: np.ndarray  # (b, k) int64; padding where a query has fewer negatives
    cw: np.ndarray  # (b,) content-word counts
    k: int

    @property
    def size(self) -> int:
        return len(self.queries)

    def valid(self) -> np.ndarray:
        """(b, k) True where a query has a real negative in that slot."""
        counts = np.array([len(n) for n in self.negatives])
        return np.arange(self.k)[None, :] < counts[:, None]


class Examples:
    """The training examples (``data.EXAMPLES``) as lists, to cut batches from quickly."""

    def __init__(self, table: pa.Table, k: int) -> None:
        self.k = k  # hard-negative slots per query
        self.queries = table.column("query").to_pylist()
        self.positives = table.column("positive").to_pylist()
        self.negatives = table.column("negatives").to_pylist()
        self.positive_keys = table.column("positive_key").to_numpy()
        self.cw = table.column("cw").to_numpy()
        keys = table.column("negative_keys").to_pylist()
        self.negative_keys = np.full((len(keys), k), PAD_KEY, np.int64)  # (n, k)
        for i, row in enumerate(keys):
            self.negative_keys[i, : len(row)] = row

    def __len__(self) -> int:
        return len(self.queries)

    def batch(self, rows: np.ndarray) -> Batch:
        return Batch(
            queries=[self.queries[i] for i in rows],
            positives=[self.positives[i] for i in rows],
            negatives=[self.negatives[i] for i in rows],
            positive_keys=self.positive_keys[rows],
            negative_keys=self.negative_keys[rows],
            cw=self.cw[rows],
            k=self.k,
        )


def global_batch_rows(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """(batch_size,) example rows of global batch `step`: a fixed function of the seed, so a
    resumed run trains on exactly the batches it would have.

    Each epoch is a fresh permutation of the n examples in batches of batch_size; the last,
    short batch is filled from the start of the same permutation (so n = 10,573 at 128 per
    step is 83 steps, as in the paper, and a batch never holds one example twice).
    """
    per_epoch = -(-n // batch_size)
    epoch, j = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    rows = order[j * batch_size : (j + 1) * batch_size]
    return np.concatenate([rows, order[: batch_size - len(rows)]])


@dataclass(frozen=True)
class StepOptions:
    """How a step runs: the `train:` section's settings by its names (`configured_step` derives
    them), the instructions the encoder trains with, and the autocast its device allows."""

    query_prefix: str = ""
    doc_prefix: str = ""
    chunk_size: int | None = None  # texts per forward; None: one forward per step
    max_grad_norm: float | None = 1.0
    cw_weighting: bool = False
    autocast: torch.dtype | None = None  # bfloat16 on GPU, None on CPU


class _RandomState:
    """The CPU (and CUDA) random state at one point, to replay dropout exactly."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    @contextmanager
    def replay(self) -> Iterator[None]:
        devices = [self.device] if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            yield


@dataclass(frozen=True)
class _Chunk:
    rows: torch.Tensor  # positions of its texts among the step's texts
    tokens: Mapping[str, torch.Tensor]


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _mean_over_workers(values: torch.Tensor) -> torch.Tensor:
    if _world() > 1:
        values = values.clone()
        dist.all_reduce(values)
        values /= _world()
    return values


def _max_over_workers(value: int, device: torch.device) -> int:
    if _world() == 1:
        return value
    t = torch.tensor([value], device=device)  # NCCL reduces only device tensors
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _chunk_count(texts: int, size: int) -> int:
    return -(-texts // size)


class ContrastiveStep:
    """Batch -> one optimiser step; returns the step's metrics (averaged over workers)."""

    def __init__(
        self,
        model: nn.Module,
        encoder: Encoder,
        loss: InfoNCELoss,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        options: StepOptions,
    ) -> None:
        self.model = model  # Towers, DDP around it, or Towers sharded (FSDP2)
        self.encoder = encoder  # the same encoder, unwrapped (tokeniser, first cache pass)
        self.sharded = isinstance(model, FSDPModule)
        self.loss = loss
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.options = options

    def _autocast(self) -> Any:
        if self.options.autocast is None:
            return nullcontext()
        return torch.autocast(self.encoder.device.type, dtype=self.options.autocast)

    def _tokens(self, texts: Sequence[str]) -> Mapping[str, torch.Tensor]:
        return self.encoder.tokenize(texts).to(self.encoder.device)

    def _texts(self, batch: Batch) -> tuple[list[str], list[str]]:
        qp, dp = self.options.query_prefix, self.options.doc_prefix
        docs = batch.positives + [t for negs in batch.negatives for t in negs]
        return [qp + q for q in batch.queries], [dp + t for t in docs]

    def loss_of(self, q: torch.Tensor, d: torch.Tensor, batch: Batch) -> LossOutput:
        """The loss of this worker's query embeddings q (b, dim) and document embeddings d
        (b positives, then the real negatives in order)."""
        b, k, dim = batch.size, batch.k, q.shape[1]
        valid = torch.from_numpy(batch.valid()).to(q.device)  # (b, k)
        slots = torch.nonzero(valid.reshape(-1)).squeeze(1)  # (real negatives,) in row order
        negatives = d.new_zeros(b * k, dim).index_copy(0, slots, d[b:])  # (b·k, dim) padded
        cw = torch.tensor(batch.cw, device=q.device) if self.options.cw_weighting else None
        return self.loss(
            q,
            d[:b],
            negatives.view(b, k, dim),
            valid,
            torch.tensor(batch.positive_keys, device=q.device),
            torch.tensor(batch.negative_keys, device=q.device),
            cw,
        )

    def _plain(self, queries: list[str], docs: list[str], batch: Batch) -> LossOutput:
        with self._autocast():
            q, d = self.model([self._tokens(queries), self._tokens(docs)])
        out = self.loss_of(q, d, batch)
        out.loss.backward()
        return out

    def _chunks(self, texts: list[str], offset: int) -> list[_Chunk]:
        """Chunks of at most chunk_size texts, longest first (less padding)."""
        size = self.options.chunk_size or len(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        return [
            _Chunk(
                torch.tensor(order[s : s + size]) + offset,
                self._tokens([texts[i] for i in order[s : s + size]]),
            )
            for s in range(0, len(texts), size)
        ]

    def _embed(self, tokens: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(c, dim) embeddings for the cache's first pass (no graph): through the sharded root,
        whose hooks gather the parameters outside the blocks (the embeddings); under DDP the
        plain encoder, as DDP's own forward would synchronise buffers for nothing."""
        return self.model([tokens])[0] if self.sharded else self.encoder(tokens)

    def _cached(
        self, queries: list[str], docs: list[str], batch: Batch, padding: int
    ) -> LossOutput:
        """`padding`: forwards and zero backwards to run after the chunks, so that this worker
        runs as many as the worker with the most (sharded only)."""
        chunks = self._chunks(queries, 0) + self._chunks(docs, len(queries))
        pad = self._tokens(queries[:1])  # a real text: any tokeniser gives it a valid input
        device = self.encoder.device
        states, firsts = [], []
        with torch.no_grad(), self._autocast():
            for chunk in chunks:
                states.append(_RandomState(device))
                firsts.append(self._embed(chunk.tokens))  # (c, dim)
            for _ in range(padding):
                self._embed(pad)
        rows = torch.cat([c.rows for c in chunks]).to(device)  # (texts,) chunk order -> text
        embeddings = torch.cat(firsts)[torch.argsort(rows)]  # (texts, dim) in text order
        embeddings.requires_grad_(True)
        out = self.loss_of(embeddings[: len(queries)], embeddings[len(queries) :], batch)
        out.loss.backward()  # the batch loss's gradient w.r.t. every embedding
        grads = embeddings.grad
        assert grads is not None  # the backward above filled it (embeddings require a grad)
        no_sync = getattr(self.model, "no_sync", None)  # DDP: reduce once, after the last
        for i, (chunk, state) in enumerate(zip(chunks, states)):
            last = i == len(chunks) - 1
            sync = nullcontext() if last or no_sync is None else no_sync()
            with sync, state.replay(), self._autocast():
                (e,) = self.model([chunk.tokens])  # (c, dim), now with a graph
                e.backward(grads[chunk.rows.to(device)])
        for _ in range(padding):
            with self._autocast():
                (e,) = self.model([pad])
                e.backward(torch.zeros_like(e))  # adds nothing to any gradient
        return LossOutput(out.loss.detach(), out.accuracy)

    def __call__(self, batch: Batch) -> dict[str, float]:
        started = time.perf_counter()
        queries, docs = self._texts(batch)
        chunk = self.options.chunk_size
        # every worker takes the way of the one with the most documents (module docstring)
        most = _max_over_workers(len(docs), self.encoder.device)
        cached = chunk is not None and len(queries) + most > chunk
        if chunk is not None and cached:
            padding = _chunk_count(most, chunk) - _chunk_count(len(docs), chunk)
            out = self._cached(queries, docs, batch, padding if self.sharded else 0)
        else:
            out = self._plain(queries, docs, batch)
        params = [p for p in self.encoder.parameters() if p.requires_grad]
        # sharded: the gradients are DTensors, and the norm is the global one, replicated
        norm = torch.nn.utils.clip_grad_norm_(params, self.options.max_grad_norm or math.inf)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss, accuracy = _mean_over_workers(
            torch.stack([out.loss.detach(), out.accuracy.detach()]).float()
        ).tolist()
        seconds = time.perf_counter() - started
        pairs = batch.size * _world()
        return {
            "loss": loss,
            "accuracy": accuracy,
            "lr": lr,
            "grad_norm": float(norm),
            "seconds": seconds,
            "pairs_per_s": pairs / seconds,
            "gradient_cache": cached,
        }


def optimizer_for(
    encoder: Encoder, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only (not on biases and norm weights, as
    transformers' Trainer and sentence-transformers do)."""
    params = [p for p in encoder.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # fused: one kernel over all parameters (CPU too), as transformers' default adamw_torch_fused
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)


def cosine_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then a cosine from the peak towards `min_ratio` of it at the end (as
    transformers' cosine schedule: the last step's rate is just above the floor)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def configured_step(
    model: nn.Module,
    encoder: Encoder,
    tc: TrainConfig,
    schedule_steps: int,
    prefixes: tuple[str, str] = ("", ""),
) -> ContrastiveStep:
    """The step `train:` describes, over `model` (Towers, DDP around it, or sharded): AdamW over
    the encoder's trainable parameters (built after sharding: over each worker's slice), the
    cosine schedule over `schedule_steps`, InfoNCE at the configured temperature, bfloat16
    autocast on a GPU. One assembly, so the trainer, the memory plan's measurement and the GPU
    check step the same way."""
    optimizer = optimizer_for(encoder, tc.lr, tc.betas, tc.eps, tc.weight_decay)
    scheduler = cosine_schedule(optimizer, schedule_steps, tc.warmup_steps, tc.min_lr_ratio)
    on_gpu = encoder.device.type == "cuda"
    options = derive(
        StepOptions,
        tc,
        query_prefix=prefixes[0],
        doc_prefix=prefixes[1],
        autocast=torch.bfloat16 if on_gpu and tc.bf16 else None,
    )
    return ContrastiveStep(
        model, encoder, InfoNCELoss(tc.temperature), optimizer, scheduler, options
    )
