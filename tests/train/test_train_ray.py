"""`cpr train` end to end on Ray Train: a sharded (FSDP) run of two workers with checkpoints on
a real S3 endpoint (moto), a worker failure resumed from the last checkpoint with the same
step count and the weights of an uninterrupted run, and the final model in
sentence-transformers form; a sharded LoRA run whose checkpoints hold only the adapters and whose
final model has them merged; which checkpoint a restart restores from, for both strategies;
plus the one-line errors of the CLI and the job, and an OUT that refuses a run on other data or
settings (LoRA's among them). (Two
workers training as one process: test_train_distributed.py, with torch.distributed directly,
which costs a fraction of a Ray worker group here; a DDP run resumed after a lost node:
test_node_loss.py.)"""

from __future__ import annotations

import importlib.util
import json
import posixpath
import re
import signal
import socket
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest
import torch
from typer.testing import CliRunner

from cpr_ray.config import Config, load_config
from cpr_ray.cpr_command import app
from cpr_ray.retrieval.encoder import DenseEncoder, Encoder
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.storage.store import Storage, StorageConfig
from cpr_ray.train.checkpoints import newest_checkpoint
from cpr_ray.train.lora import add_adapters, merge
from cpr_ray.train.step import Examples, Towers, configured_step, freeze_unused, global_batch_rows
from cpr_ray.train.trainer import run_train
from tests import tiny_models
from tests.runs.test_cli import error_line
from tests.train.test_train_step import TOPICS

ROOT = Path(__file__).resolve().parents[2]


def _triplets(path: Path) -> str:
    rows = [
        {"query": q, "positive": d, "negatives": [TOPICS[(i + 3) % len(TOPICS)][1]]}
        for i, (q, d) in enumerate(TOPICS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class FailOnce:
    """Fails rank 0 at `step` the first time only (a marker file remembers), like a lost node."""

    def __init__(self, marker: Path, step: int) -> None:
        self.marker, self.step = str(marker), step

    def __call__(self, step: int, rank: int) -> None:
        if rank == 0 and step == self.step and not Path(self.marker).exists():
            Path(self.marker).touch()
            raise RuntimeError("injected worker failure")


def _uninterrupted(cfg: Config, storage: Storage) -> Encoder:
    """The run's steps in this process, on the examples and instructions the run wrote: what
    the workers compute together (the tiny model has no dropout, the one per-worker input)."""
    tc, out = cfg.train, cfg.train.out
    run = storage.read_json(f"{out}/run.json")
    examples = Examples(
        storage.read_parquet(f"{out}/examples.parquet"), run["data"]["max_negatives"]
    )
    encoder = Encoder.build(
        cfg.encoder.model, cfg.encoder.pooling, max_length=tc.max_length, dtype=cfg.encoder.dtype
    )
    freeze_unused(encoder)
    if tc.lora is not None:
        add_adapters(encoder, tc.lora, tc.seed)
    prefixes = (run["query_prefix"], run["doc_prefix"])
    step = configured_step(Towers(encoder), encoder, tc, run["steps"], prefixes)
    for s in range(run["steps"]):
        step(examples.batch(global_batch_rows(len(examples), tc.batch_size, tc.seed, s)))
    return encoder if tc.lora is None else merge(encoder)


def _sharded_config(minilm: str, tmp_path: Path, out: Path | str, *overrides: str) -> Config:
    """A sharded (FSDP) run of a tiny BERT without dropout (so one process can train as the
    workers do, and its checkpoints are small to upload) on 8 triplets, restarted once at most."""
    model = tiny_models.tiny_bert(minilm, tmp_path / "tiny-bert", dropout=0.0)
    return load_config(
        overrides=[
            f"train.data={_triplets(tmp_path / 'train.jsonl')}",
            "train.format=triplets",
            f"encoder.model={model}",
            f"train.out={out}",
            "train.strategy=fsdp",
            "train.max_failures=1",
            *overrides,
        ]
    )


def test_a_failed_sharded_run_resumes_from_its_s3_checkpoint(
    ray_session, s3_endpoint: str, s3_bucket: str, minilm: str, tmp_path: Path, capsys
):
    out = f"s3://{s3_bucket}/runs/tiny"
    cfg = _sharded_config(
        minilm,
        tmp_path,
        out,
        f"storage.s3_endpoint={s3_endpoint}",
        "train.workers=2",
        "train.gradient_checkpointing=true",
        "train.batch_size=4",
        "train.chunk_size=4",  # 2 queries, 4 documents a worker: the gradient cache
        "train.max_length=32",
        "train.epochs=2",  # 8 examples, 4 per step: 4 steps
        "train.lr=1e-3",
        "train.checkpoint_every=2",
        "tracking.enabled=true",  # OUT is on S3: MLflow's store named
        f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
    )
    summary = run_train(cfg, on_step=FailOnce(tmp_path / "failed", step=3))
    assert (tmp_path / "failed").exists()  # the failure did happen, and the run went on
    # the driver prints each step rank 0 finished, once: step 3 again after the restart
    printed = re.findall(r"\[cpr train\] step (\d)/4 loss", capsys.readouterr().err)
    assert printed == ["1", "2", "3", "3", "4"], printed
    storage = Storage(StorageConfig(s3_endpoint=s3_endpoint))
    rows = [json.loads(line) for line in storage.read_text(f"{out}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # each step once, in order
    assert [r["resumed_from"] for r in rows] == [0, 0, 2, 2]  # 3 and 4 after the restart
    assert all(np.isfinite(r["loss"]) and r["gradient_cache"] for r in rows)
    assert summary["steps"] == 4 and len(summary["peak_memory_mb_per_worker"]) == 2
    checkpoints = [d for d in storage.list_dirs(f"{out}/run") if "/checkpoint_" in d]
    assert len(checkpoints) == 2  # steps 2 and 4
    loc = storage.resolve(checkpoints[-1])
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True))
    files = {posixpath.relpath(i.path, loc.path) for i in infos if i.type == pafs.FileType.File}
    # both workers' reports merged into one checkpoint folder
    assert {
        "state.pt",
        "sharded/.metadata",
        "sharded/__0_0.distcp",
        "sharded/__1_0.distcp",
    } <= files

    local = tmp_path / "model"
    saved = storage.resolve(summary["model"])
    pafs.copy_files(saved.path, str(local), source_filesystem=saved.fs)
    expected = _uninterrupted(cfg, storage)
    trained = Encoder.load(str(local)).state_dict()
    initial = Encoder.build(cfg.encoder.model).state_dict()
    # as if it never failed. AdamW moves a weight whose gradient is tiny against eps by a
    # fraction of lr that float noise in the order of the workers' sums changes: up to ~5e-6
    # here; a resume that lost the optimiser or the schedule is off by ~lr (1e-3)
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(trained[name], tensor, atol=2e-5, rtol=0, msg=name)
    moved = "backbone.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(trained[moved], initial[moved])
    from sentence_transformers import SentenceTransformer

    texts = ["amber basalt cobalt", "dune ember fjord garnet"]
    prefix = storage.read_json(f"{out}/run.json")["doc_prefix"]
    with torch.no_grad():
        vectors = expected(expected.tokenize([prefix + t for t in texts])).numpy()
    st = SentenceTransformer(str(local), device="cpu")
    np.testing.assert_allclose(st.encode_document(texts), vectors, atol=1e-5)
    encoder = DenseEncoder(EncoderSpec(model=str(local)))  # what `cpr eval --model PATH` builds
    assert encoder.spec.pooling == "mean" and encoder.encode_queries(["a"]).shape == (1, 32)

    assert run_train(cfg)["skipped"]  # a finished run is not trained again
    _assert_one_mlflow_run(cfg, storage, summary)


def _assert_one_mlflow_run(cfg: Config, storage: Storage, summary: dict) -> None:
    """The run and its restart are one MLflow run with each step once (rank 0's), its settings
    and both workers' peak memory, and its model; a rerun of the OUT reopens that run."""
    from mlflow import MlflowClient

    from cpr_ray.runs import tracking

    client = MlflowClient(cfg.tracking.uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cpr-ray").experiment_id])
    assert summary["mlflow"] == {"uri": cfg.tracking.uri, "run_id": run.info.run_id}
    for name in ("loss", "accuracy", "lr", "pairs_per_s"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, name)] == [1, 2, 3, 4]
    assert {"peak_memory_mb/worker_0", "peak_memory_mb/worker_1"} <= set(run.data.metrics)
    params = run.data.params
    assert (params["workers"], params["strategy"], params["train.epochs"]) == ("2", "fsdp", "2")
    assert params["data.format"] == "triplets" and params["encoder.model"] == cfg.encoder.model
    files = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/README.md", "model/model.safetensors"} <= files
    assert run.info.status == "FINISHED"
    # a killed run's rerun continues it, after its last logged step
    again = tracking.start_training(cfg, storage, summary["model"].rsplit("/", 1)[0], {})
    assert again is not None and (again.run_id, again.last_step) == (run.info.run_id, 4)


class _Holder:
    def ready(self) -> bool:
        return True


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_lora_run_checkpoints_only_its_adapters_and_saves_them_merged(
    ray_session, minilm: str, tmp_path: Path, capsys
):
    """Sharded, on one worker (two: the sharded run above; LoRA on two workers:
    test_train_distributed.py): the adapters' slices and optimiser state are the whole
    checkpoint, a restart adds fresh adapters to the base model and loads them, and the final
    model is the base with the adapters merged, as one process computes it."""
    from torch.distributed.checkpoint import FileSystemReader

    out = tmp_path / "out"
    cfg = _sharded_config(
        minilm,
        tmp_path,
        out,
        "train.batch_size=4",  # 8 examples: 2 steps
        "train.max_length=32",
        "train.lr=1e-2",
        "train.lora.r=4",
        "train.lora.dropout=0",
        "train.checkpoint_every=1",
        "tracking.enabled=true",
        f"tracking.uri=http://127.0.0.1:{_closed_port()}",  # no tracking server there
    )
    # other work holds one of the session's two CPUs: by default the run takes the one that is
    # free (asking for both, Ray Train would wait for ever), and leaves Ctrl-C as it found it
    import ray

    holder = ray.remote(num_cpus=1)(_Holder).remote()
    ray.get(holder.ready.remote())
    sigint = signal.getsignal(signal.SIGINT)
    try:
        summary = run_train(cfg, on_step=FailOnce(tmp_path / "failed", step=2))
    finally:
        ray.kill(holder)
    assert signal.getsignal(signal.SIGINT) is sigint
    assert (tmp_path / "failed").exists() and summary["steps"] == 2
    # tracking never costs a run: one line says the server did not answer
    said = [line for line in capsys.readouterr().err.splitlines() if "tracking" in line]
    assert len(said) == 1 and cfg.tracking.uri in said[0], said
    assert summary["mlflow"] is None
    assert summary["cpus_per_worker"] == 1
    storage = Storage(StorageConfig())
    rows = [json.loads(line) for line in storage.read_text(f"{out}/metrics.jsonl").splitlines()]
    assert [r["resumed_from"] for r in rows] == [0, 1]  # step 2 from step 1's adapters
    base_bytes = (Path(cfg.encoder.model) / "model.safetensors").stat().st_size
    checkpoints = sorted(p for p in (out / "run").glob("checkpoint_*") if p.is_dir())
    assert len(checkpoints) == 2
    for checkpoint in checkpoints:
        sizes = [p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()]
        assert sum(sizes) < base_bytes / 5  # the adapters, their moments and DCP's index
        index = FileSystemReader(str(checkpoint / "sharded")).read_metadata()
        weights = [k for k in index.state_dict_metadata if k.startswith("model.")]
        assert weights and all(".lora_" in k for k in weights), weights

    local = out / "model"
    expected = _uninterrupted(cfg, storage)
    trained = Encoder.load(str(local)).state_dict()
    initial = Encoder.build(cfg.encoder.model).state_dict()
    assert trained.keys() == initial.keys()  # a plain model: no adapter, no peft names
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(trained[name], tensor, atol=2e-5, rtol=0, msg=name)
    moved = "backbone.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(trained[moved], initial[moved])  # the adapters, merged
    from sentence_transformers import SentenceTransformer

    texts = ["amber basalt cobalt", "dune ember fjord garnet"]
    with torch.no_grad():
        vectors = expected(expected.tokenize(texts)).numpy()
    st = SentenceTransformer(str(local), device="cpu")
    np.testing.assert_allclose(st.encode(texts), vectors, atol=1e-5)


def _checkpoint_folder(root: Path, name: str, state: dict, files: dict[str, int]) -> None:
    folder = root / "run" / name
    for path, size in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(b"x" * size)
    torch.save(state, folder / "state.pt")


def test_a_restart_restores_the_newest_whole_checkpoint(tmp_path: Path):
    """A checkpoint counts when storage holds the files its state.pt lists, at those sizes:
    the model or a LoRA run's adapters (ddp), or every worker's slices and the index (fsdp);
    only the state, and the model, the adapters or the index, are copied (each worker fetches
    the slices it reads)."""
    storage = Storage(StorageConfig())
    out = tmp_path / "out"
    model = {"model.safetensors": 5, "1_Pooling/config.json": 2}
    slices = {"sharded/.metadata": 3, "sharded/__0_0.distcp": 7, "sharded/__1_0.distcp": 7}
    lists = {k.split("/", 1)[1]: v for k, v in slices.items()}
    _checkpoint_folder(
        out,
        "checkpoint_1",
        {"step": 1, "files": model},
        {f"model/{k}": v for k, v in model.items()},
    )
    _checkpoint_folder(out, "checkpoint_2", {"step": 2, "sharded": True, "files": lists}, slices)
    del slices["sharded/__1_0.distcp"]  # a worker's upload that never came
    _checkpoint_folder(out, "checkpoint_3", {"step": 3, "sharded": True, "files": lists}, slices)
    cut = {"model/model.safetensors": 4, "model/1_Pooling/config.json": 2}  # cut short
    _checkpoint_folder(out, "checkpoint_4", {"step": 4, "files": model}, cut)
    adapter = {"adapter_model.safetensors": 4, "adapter_config.json": 2}  # LoRA (ddp)
    state = {"step": 5, "adapter": True, "files": adapter}
    _checkpoint_folder(out, "checkpoint_5", state, {"adapter/adapter_config.json": 2})

    restored = newest_checkpoint(storage, str(out), str(tmp_path / "local"))
    assert restored is not None and restored.state["step"] == 2
    local = Path(restored.folder)
    assert sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file()) == [
        "sharded/.metadata",
        "state.pt",
    ]
    restored.fetch_sharded(storage, "__1_0.distcp")
    assert (local / "sharded" / "__1_0.distcp").stat().st_size == 7

    storage.delete_dir(str(out / "run" / "checkpoint_2"))
    restored = newest_checkpoint(storage, str(out), str(tmp_path / "again"))
    assert restored is not None and restored.state["step"] == 1
    assert (Path(restored.folder) / "model" / "1_Pooling" / "config.json").exists()

    # the adapters' upload completed: a flat folder, copied whole
    (out / "run" / "checkpoint_5" / "adapter" / "adapter_model.safetensors").write_bytes(b"x" * 4)
    restored = newest_checkpoint(storage, str(out), str(tmp_path / "adapter"))
    assert restored is not None and restored.state["step"] == 5
    assert sorted(p.name for p in (Path(restored.folder) / "adapter").iterdir()) == sorted(adapter)


def test_cli_and_job_report_a_malformed_file_in_one_line(minilm: str, tmp_path: Path, capsys):
    (tmp_path / "t.jsonl").write_text('{"query": "a", "positive": "b"}\n{"query": 5}\n')
    args = ["--data", str(tmp_path / "t.jsonl"), "--format", "triplets", "--model", minilm]
    args += ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, ["train", *args])
    assert "t.jsonl line 2: column 'query' holds int, expected text" in error_line(result)
    spec = importlib.util.spec_from_file_location("train_job", ROOT / "jobs" / "train.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    assert job.main([*args[:-1], str(tmp_path / "out2"), "--set", "train.batch_size=1"]) == 2
    assert "t.jsonl line 2" in capsys.readouterr().err
    missing = [*args[:4], "--out", str(tmp_path / "out3"), "--model", str(tmp_path / "none")]
    result = CliRunner().invoke(app, ["train", *missing])
    assert "(read as a folder): no such folder" in error_line(result)


def test_an_out_refuses_a_run_on_other_data(minilm: str, tmp_path: Path):
    from cpr_ray.errors import ConfigError
    from cpr_ray.train.trainer import prepare_run

    data = tmp_path / "train.jsonl"
    overrides = [
        f"train.data={_triplets(data)}",
        "train.format=triplets",
        f"encoder.model={minilm}",
        f"train.out={tmp_path / 'out'}",
        "train.batch_size=4",
    ]
    storage = Storage(StorageConfig())
    plan, stats = prepare_run(load_config(overrides=overrides), storage)
    assert (plan.total_steps, plan.negatives, stats["examples"]) == (2, 1, 8)
    moved = [*overrides, "train.max_steps=1", "train.checkpoint_every=5"]  # operational only
    assert prepare_run(load_config(overrides=moved), storage)[0].total_steps == 1
    with pytest.raises(ConfigError, match="holds a run on other data or settings"):
        prepare_run(load_config(overrides=[*overrides, "train.lora.r=8"]), storage)
    data.write_text(data.read_text().replace("amber", "AMBER"))
    with pytest.raises(ConfigError, match="holds a run on other data or settings"):
        prepare_run(load_config(overrides=overrides), storage)
