"""Checkpoints of a training run on object storage: writing one, and finding the newest whole one.

Under ``OUT/run/checkpoint_*/`` (Ray Train's checkpoints, the newest ``train.keep_checkpoints``).
Under ``train.strategy: ddp``: ``model/`` in sentence-transformers form and ``state.pt``
(optimiser, schedule, step, metrics so far, and the size of each model file). Under ``fsdp``:
``sharded/``, a ``torch.distributed.checkpoint`` of the model and optimiser state
(``__<rank>_0.distcp`` from each worker, ``.metadata`` the index), written by every worker into
one folder (Ray Train merges the workers' reports), and ``state.pt`` (schedule, step, metrics,
the size of every worker's files). With ``train.lora`` (``lora.py``) a checkpoint holds the
adapters, never the base weights: ``adapter/`` (peft's ``adapter_model.safetensors`` and
``adapter_config.json``) in place of ``model/`` (ddp), or only the adapters' slices and
optimiser state in ``sharded/`` (fsdp); a restart loads the base model again, adds the adapters
and loads theirs. ``OUT/metrics.jsonl`` (one line per step) is written with every checkpoint.

A restart restores from what storage holds, not from Ray Train's registry (`newest_checkpoint`
says why).
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import torch
import torch.distributed as dist

from cpr_ray.storage.store import Storage, join
from cpr_ray.train.lora import save_adapter
from cpr_ray.train.sharding import METADATA_FILE, save_sharded
from cpr_ray.train.step import ContrastiveStep

RUN_NAME = "run"  # Ray Train's run folder under OUT: the same name resumes
METRICS_FILE, MODEL_DIR = "metrics.jsonl", "model"
# in a checkpoint; sharded/: fsdp's state; adapter/: a LoRA run's adapters (ddp)
STATE_FILE, SHARDED_DIR, ADAPTER_DIR = "state.pt", "sharded", "adapter"


def upload(storage: Storage, local: str, uri: str) -> None:
    storage.make_dirs(uri)
    loc = storage.resolve(uri)
    pafs.copy_files(local, loc.path, destination_filesystem=loc.folderless_fs())


def _download(storage: Storage, uri: str, local: str) -> None:
    """A file or a folder from storage to the local path `local`."""
    loc = storage.resolve(uri)
    # a folder's own: copy_files makes only the subfolders of the files it copies
    folder = storage.file_type(loc.uri) == pafs.FileType.Directory
    os.makedirs(local if folder else os.path.dirname(local), exist_ok=True)
    pafs.copy_files(loc.path, local, source_filesystem=loc.fs)


def _model_files(folder: str) -> dict[str, int]:
    """Each file under a local folder, with its size: what a whole copy must hold."""
    root = Path(folder)
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _stored_files(storage: Storage, uri: str) -> dict[str, int]:
    """Each file under a folder on storage, with its size, named as `_model_files` names it."""
    loc = storage.resolve(uri)
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True))
    return {
        posixpath.relpath(i.path, loc.path): i.size for i in infos if i.type == pafs.FileType.File
    }


@dataclass(frozen=True)
class Restored:
    """A whole checkpoint: where it is on storage, its local copy, its training state."""

    uri: str
    # state.pt; and model/ or adapter/ (ddp), or the sharded index sharded/.metadata (fsdp)
    folder: str
    state: dict[str, Any]

    def fetch_sharded(self, storage: Storage, name: str) -> None:
        """One file of the sharded state into the local copy (each worker fetches its own)."""
        _download(
            storage,
            join(self.uri, SHARDED_DIR, name),
            os.path.join(self.folder, SHARDED_DIR, name),
        )


def _content(state: dict[str, Any]) -> str:
    """The folder of a checkpoint whose ``state.pt`` is `state` that holds its weights."""
    if state.get("sharded"):
        return SHARDED_DIR
    return ADAPTER_DIR if state.get("adapter") else MODEL_DIR


def newest_checkpoint(storage: Storage, out: str, local: str) -> Restored | None:
    """The newest whole checkpoint of the run under ``OUT/run``, its state copied under
    `local`; None when there is none.

    Ray Train hands a restarted worker group only the checkpoints its controller registered,
    and it registers one once every worker's report has reached it: a node lost a moment
    after a checkpoint was written (the common case on spot workers) made the run start again
    from step 0. So the run restores from what storage holds: checkpoint folders are named by
    time, and one counts when its ``state.pt`` loads and the files on storage have the sizes
    the state lists (a copy cut short by the loss is passed over): the model's or the
    adapters' files (ddp), or every worker's slices and the index (fsdp), since a sharded
    checkpoint is whole only when each worker's upload is. Only a whole one is copied: the
    model or the adapters (ddp), or the index (fsdp; each worker later fetches the slices it
    reads)."""
    run = join(out, RUN_NAME)
    for uri in reversed(storage.list_dirs(run)):
        name = uri.rsplit("/", 1)[-1]
        if not name.startswith("checkpoint_"):
            continue
        folder = os.path.join(local, name)
        try:
            _download(storage, join(uri, STATE_FILE), os.path.join(folder, STATE_FILE))
            state = torch.load(os.path.join(folder, STATE_FILE), weights_only=False)
            content = _content(state)
            if state.get("files") != _stored_files(storage, join(uri, content)):
                continue
            needed = posixpath.join(content, METADATA_FILE) if state.get("sharded") else content
            _download(storage, join(uri, needed), os.path.join(folder, needed))
        except (OSError, RuntimeError, EOFError, ValueError):
            continue
        return Restored(uri, folder, state)
    return None


def write_metrics(storage: Storage, out: str, history: list[dict[str, Any]]) -> None:
    loc = storage.resolve(join(out, METRICS_FILE))
    with loc.fs.open_output_stream(loc.path) as f:
        f.write("".join(json.dumps(row) + "\n" for row in history).encode())


def save_checkpoint(
    storage: Storage,
    step: ContrastiveStep,
    done: int,
    history: list[dict[str, Any]],
    *,
    out: str,
    rank: int,
    tmp: str,
    sharded: bool,
    adapted: bool,
    prefixes: tuple[str, str],
) -> None:
    """The training state after `done` steps of the run under `out`; every rank reports (a
    barrier). `sharded`: fsdp's state; `adapted`: a LoRA run's; `prefixes`: the (query,
    document) instructions a saved model carries.

    ddp: rank 0 saves the model (LoRA: the adapters alone) and ``state.pt``, optimiser
    included. fsdp: every rank saves its slices of the model (LoRA: of the adapters) and
    optimiser into ``sharded/`` and reports its folder (Ray Train merges the ranks' folders
    into one checkpoint on storage); rank 0's ``state.pt`` lists every rank's files with their
    sizes, so a checkpoint missing any of them is not whole. The local copy goes once
    uploaded: a large model's checkpoints would fill the disk."""
    import ray.train

    folder = os.path.join(tmp, f"checkpoint-{done}")
    state: dict[str, Any] = {
        "scheduler": step.scheduler.state_dict(),
        "step": done,
        "history": history,
    }
    if sharded:
        shards = os.path.join(folder, SHARDED_DIR)
        save_sharded(step.model, step.optimizer, shards, trainable_only=adapted)
        files: list[dict[str, int]] = [{}] * dist.get_world_size()
        dist.all_gather_object(files, _model_files(shards))
        state.update(sharded=True, files={k: v for part in files for k, v in part.items()})
    elif rank == 0:
        content = os.path.join(folder, ADAPTER_DIR if adapted else MODEL_DIR)
        if adapted:
            save_adapter(step.encoder, content)
        else:
            step.encoder.save_sentence_transformers(
                content, query_prefix=prefixes[0], doc_prefix=prefixes[1]
            )
        state.update(
            optimizer=step.optimizer.state_dict(), files=_model_files(content), adapter=adapted
        )
    if rank == 0:
        torch.save(state, os.path.join(folder, STATE_FILE))
        write_metrics(storage, out, history)
    checkpoint = None
    if rank == 0 or sharded:
        checkpoint = ray.train.Checkpoint.from_directory(folder)
    ray.train.report(
        {"step": done, **(history[-1] if history else {})},
        checkpoint=checkpoint,
        delete_local_checkpoint_after_upload=True,
    )
