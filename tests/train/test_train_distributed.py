"""Two workers (torch.distributed over gloo, two processes) train exactly as one process on the
whole batch: the gathered loss and its gradients, and DDP and FSDP (sharded) steps of a tiny
BERT, plain and with the gradient cache (BERT's unused pooler included, which breaks DDP unless
frozen); under FSDP with AdamW too, so its sharded moments are used in the second step; and
LoRA under both (adapters only trainable, gradient checkpointing on)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from cpr_ray.config import LoRAConfig
from cpr_ray.retrieval.encoder import Encoder
from cpr_ray.train.lora import add_adapters
from cpr_ray.train.loss import InfoNCELoss
from cpr_ray.train.sharding import shard, transformer_blocks
from cpr_ray.train.step import (
    ContrastiveStep,
    StepOptions,
    Towers,
    cosine_schedule,
    freeze_unused,
    optimizer_for,
)
from tests import tiny_models
from tests.train.test_train_step import examples

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORLD, B, K, D = 2, 6, 2, 8  # global batch of 6 queries, 3 per worker
# hard negatives per example: in the first step (rows 0-3) worker 0 has 6 documents, worker 1
# two; with chunks of 4 texts worker 1 alone would not use the cache (4 texts), and it has one
# chunk of documents fewer: sharded, it must run the cache and a padding chunk all the same
NEGATIVES = (2, 2, 0, 0, 1, 1, 1, 1)
ADAMW_LR = 1e-3
# AdamW moves nearly every weight by about its rate each step whatever the gradient's size, and
# its normalisation magnifies a gradient's rounding where the gradient is near `eps`: the reduce
# order's float32 rounding moved one weight by 0.43% of a step on an AMD EPYC (0.09% here). A
# worker that drops half its batch (its first row twice) turns whole steps around: weights
# 1.4 to 3.6 steps off, in 74 of fsdp adamw's 82 tensors
ADAMW_ATOL = 0.05 * ADAMW_LR
# name: (texts per chunk, optimiser, LoRA); each trains two steps
VARIANTS = {
    "plain": (None, "sgd", False),
    "cached": (4, "sgd", False),
    "adamw": (4, "adamw", False),
    "lora": (4, "adamw", True),
}
STRATEGIES = {"ddp": ("plain", "cached", "lora"), "fsdp": ("plain", "cached", "adamw", "lora")}
LORA_B = "backbone.base_model.model.encoder.layer.0.attention.self.query.lora_B.default.weight"


def _tensors() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, p = torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)
    n = torch.randn(B, K, D, generator=g)
    valid = torch.ones(B, K, dtype=torch.bool)
    valid[4, 1] = False
    pos_keys = torch.tensor([10, 11, 12, 10, 14, 15])  # queries 0 and 3: one positive
    neg_keys = torch.arange(B * K).reshape(B, K)
    cw = torch.tensor([3, 1, 4, 1, 5, 9])
    return q, p, n, valid, pos_keys, neg_keys, cw


def _loss_and_grads(rows: slice) -> dict[str, torch.Tensor]:
    q, p, n, valid, pk, nk, cw = _tensors()
    leaves = [t[rows].clone().requires_grad_() for t in (q, p, n)]
    out = InfoNCELoss(0.05)(*leaves, valid[rows], pk[rows], nk[rows], cw[rows])
    out.loss.backward()
    return {"loss": out.loss.detach(), **{k: t.grad for k, t in zip("qpn", leaves)}}


def _trained(
    model_dir: str, world: int, rank: int, strategy: str, variant: str
) -> dict[str, torch.Tensor]:
    """The weights (whole) after two steps on this rank's share of two global batches, and the
    second step's loss and gradient norm (over all workers)."""
    chunk, kind, lora = VARIANTS[variant]
    ex = examples(NEGATIVES)
    share = 4 // world
    enc = Encoder.build(model_dir, "mean", max_length=16).eval()  # no dropout
    freeze_unused(enc)
    if lora:  # the same A on every worker; sharded, blocks mix frozen and trainable weights
        add_adapters(enc, LoRAConfig(r=4, alpha=8.0, dropout=0.0), seed=0)
        enc.backbone.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    model: torch.nn.Module = Towers(enc)
    if world > 1 and strategy == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif world > 1:
        model = shard(model, torch.device("cpu"), bf16=True)  # bf16: on GPU only
    if kind == "sgd":  # lr 1: the weights move by the gradient itself
        opt = torch.optim.SGD([p for p in enc.parameters() if p.requires_grad], lr=1.0)
    else:  # the trainer's
        opt = optimizer_for(enc, lr=ADAMW_LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    step = ContrastiveStep(
        model,
        enc,
        InfoNCELoss(0.05),
        opt,
        cosine_schedule(opt, 1000),
        StepOptions(chunk_size=chunk),
    )
    for s in range(2):
        rows = np.arange(4 * s, 4 * s + 4)[rank * share : (rank + 1) * share]
        metrics = step(ex.batch(rows))
    weights = {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
        for k, v in enc.state_dict().items()
    }
    return {
        **weights,
        "loss": torch.tensor(metrics["loss"]),
        "norm": torch.tensor(metrics["grad_norm"]),
    }


def _base_name(name: str) -> str:
    """A base weight's name under peft, as the plain encoder names it."""
    return name.replace("base_model.model.", "").replace(".base_layer.", ".")


def _worker(rank: int, folder: str, model_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD
    )
    try:
        share = B // WORLD
        result = {"gather": _loss_and_grads(slice(rank * share, (rank + 1) * share))}
        for strategy, variants in STRATEGIES.items():
            for variant in variants:
                result[f"{strategy} {variant}"] = _trained(
                    model_dir, WORLD, rank, strategy, variant
                )
        torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_workers_train_as_one_process_on_the_whole_batch(tmp_path: Path, tiny_bert: str):
    torch.multiprocessing.start_processes(
        _worker, args=(str(tmp_path), tiny_bert), nprocs=WORLD, start_method="spawn"
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]

    whole = _loss_and_grads(slice(0, B))
    gathered = [r["gather"] for r in ranks]
    # the batch loss is the workers' mean; DDP divides the summed gradients by the world size
    assert torch.stack([g["loss"] for g in gathered]).mean().item() == pytest.approx(
        whole["loss"].item(), rel=1e-6
    )
    for key in "qpn":
        torch.testing.assert_close(torch.cat([g[key] for g in gathered]) / WORLD, whole[key])

    single = {v: _trained(tiny_bert, 1, 0, "single", v) for v in VARIANTS}
    for strategy, variants in STRATEGIES.items():
        for variant in variants:
            name = f"{strategy} {variant}"
            # SGD at rate 1 moves each weight by its gradient: equal up to the reduce order's
            # rounding; AdamW's weights within a small share of its step (ADAMW_ATOL)
            adamw = VARIANTS[variant][1] == "adamw"
            for r in ranks:
                for k, v in single[variant].items():
                    weight = k not in ("loss", "norm")
                    tol = (ADAMW_ATOL, 0) if adamw and weight else (1e-6, 1e-5)
                    torch.testing.assert_close(
                        r[name][k], v, atol=tol[0], rtol=tol[1], msg=f"{name} {k}"
                    )
    initial = Encoder.build(tiny_bert, "mean").state_dict()
    moved = "backbone.encoder.layer.0.attention.self.query.weight"
    for variant in ("plain", "cached", "adamw"):  # the steps did train
        assert not torch.equal(single[variant][moved], initial[moved])
    adapted = [single["lora"]] + [r[f"{s} lora"] for r in ranks for s in ("ddp", "fsdp")]
    for weights in adapted:  # LoRA: the adapters trained; not one bit of a base weight moved
        base = {_base_name(k): v for k, v in weights.items() if k.startswith("backbone.")}
        base = {k: v for k, v in base.items() if ".lora_" not in k}
        assert base.keys() == initial.keys()
        for name, tensor in initial.items():
            assert torch.equal(base[name], tensor), name
        assert weights[LORA_B].abs().max() > 0  # B starts at zero


def test_the_units_sharded_are_the_transformer_blocks(tiny_bert: str):
    """Each block becomes one FSDP unit, found by structure: BERT's encoder.layer, Qwen3's
    layers (a decoder, as Qwen3-Embedding is), under the encoder and Towers alike."""
    from transformers import Qwen3Model

    bert = Encoder.build(tiny_bert)
    assert transformer_blocks(Towers(bert)) == list(bert.backbone.encoder.layer)
    qwen = Qwen3Model(
        tiny_models.qwen3_config(64, 16, 32, layers=3, heads=2, kv_heads=1, head_dim=8)
    )
    assert transformer_blocks(qwen) == list(qwen.layers)
