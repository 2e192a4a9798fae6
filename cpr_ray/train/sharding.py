"""Sharded training (``train.strategy: fsdp``): PyTorch FSDP2 over the encoder, and its state.

``fully_shard`` goes on each transformer block, then on the root module (:class:`Towers`, which
holds what no block does: embeddings, final norm). Each worker keeps a 1/W slice of every
parameter, its gradient and its optimiser state (DTensors sharded on dim 0); a block's whole
parameters exist only while it runs forward or backward, so a worker holds the full weights of
a block or two at a time (the next one is gathered ahead), not of the model.

Checkpoints go through ``torch.distributed.checkpoint`` (DCP): every worker writes the slices it
holds (``__<rank>_0.distcp``), rank 0 the index of where each slice is (``.metadata``). A worker
restoring reads only the files the index sends it to (`FetchingReader`), so a restart never
copies every worker's share of a large model to every worker, and a run resumed on a different
number of workers reads the slices it now needs. The final model is gathered whole on rank 0
(`full_state_dict`) and saved as a plain model. Under LoRA (``lora.py``) the frozen base weights
are sharded as any others, but checkpoints and the final gather take only the trainable
parameters (``trainable_only``): the adapters (FSDP2 shards each parameter on its own, so a
block may mix frozen and trainable ones; only the trainable ones need one dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.futures import Future

METADATA_FILE = ".metadata"  # DCP's index of a checkpoint, written by rank 0


def transformer_blocks(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformer, found by structure, not by class name: the entries
    of every outermost ``nn.ModuleList`` (BERT's ``encoder.layer``, Qwen3's and Llama's
    ``layers``, and the same under a peft wrapper), those that hold parameters."""
    blocks: list[nn.Module] = []
    lists: list[str] = []
    for name, child in module.named_modules():
        # a list inside a block (experts, say) is part of that block's unit
        if isinstance(child, nn.ModuleList) and not any(name.startswith(f"{n}.") for n in lists):
            lists.append(name)
            blocks += [m for m in child if next(m.parameters(), None) is not None]
    return blocks


def shard(model: nn.Module, device: torch.device, bf16: bool) -> nn.Module:
    """`model` sharded over every worker of the default process group, on `device`.

    fully_shard moves each unit's parameters to the device as it shards them, so a GPU never
    holds more than one unit (a block, or the root's embeddings) whole. On GPU with `bf16`,
    units compute in bfloat16 from float32 shards and gradients are reduced in float32
    (summing many workers' bfloat16 gradients loses precision); on CPU everything stays
    float32, as under DDP."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if device.type == "cuda" and bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    sharded = fully_shard(model, mesh=mesh, mp_policy=policy)
    # the module itself, its class now mixing FSDPModule into its own: still an nn.Module
    assert isinstance(sharded, nn.Module)
    return sharded


def full_state_dict(model: nn.Module, *, trainable_only: bool = False) -> dict[str, Any]:
    """Every parameter and buffer of a sharded `model` (`trainable_only`: without the frozen
    parameters, e.g. a LoRA run's base weights), whole, in CPU memory on rank 0 (an empty dict
    on the others). Every rank must call it: the slices are gathered."""
    options = StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
    )
    return get_model_state_dict(model, options=options)


def save_sharded(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    folder: str,
    *,
    trainable_only: bool = False,
) -> None:
    """This rank's slices of the model and optimiser state into `folder` (a local folder of its
    own: DCP needs no shared file system); rank 0 also writes the index. A collective.

    `trainable_only`: the parameters that train (a LoRA run's adapters) and buffers, not the
    frozen ones, which the run takes from the base model again when it resumes."""
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)


def load_sharded(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    reader: FileSystemReader,
    *,
    trainable_only: bool = False,
) -> None:
    """The model's and optimiser's state from a checkpoint `save_sharded` wrote, with the same
    `trainable_only`. A collective."""
    # the state dicts of the live model and optimiser are the targets DCP reads the slices into
    # (an optimiser that has not stepped gets its moments created first, at zero); DCP fails on
    # a target missing from the checkpoint, so only the frozen parameters stay as they are
    options = StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, storage_reader=reader)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,  # dcp.load filled these in place
        optim_state_dict=optimizer_state,
        options=options,
    )


class FetchingReader(FileSystemReader):
    """DCP's reader of a local folder that first copies into it, from storage, the files this
    rank's reads touch (`fetch(name)` copies one): a restarted worker downloads its own slices,
    not every worker's. The index (``.metadata``) must be in the folder already."""

    def __init__(self, folder: str, fetch: Callable[[str], None]) -> None:
        super().__init__(folder)
        self.fetch = fetch

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        # storage_data: the index's location of each item, set from .metadata before any read
        for name in sorted({self.storage_data[i.storage_index].relative_path for i in plan.items}):
            self.fetch(name)
        return super().read_data(plan, planner)
