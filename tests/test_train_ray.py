"""`cpr train` end to end on Ray Train: checkpoints on a real S3 endpoint (moto), a worker
failure resumed from the last checkpoint with the same step count, and the final model in
sentence-transformers form; plus the one-line errors of the CLI and the job, and an OUT that
refuses a run on other data. (Two workers training as one: test_train_distributed.py, with
torch.distributed directly, which costs a fraction of a Ray worker group here.)"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from cpr_ray.cli import app
from cpr_ray.config import load_config
from cpr_ray.retrieval.encoder import DenseEncoder
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.storage import Storage, StorageConfig
from cpr_ray.train.trainer import run_train
from tests.test_cli import error_line
from tests.test_train_step import TOPICS, make_tiny_bert

ROOT = Path(__file__).resolve().parents[1]


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


def test_a_failed_worker_resumes_from_its_s3_checkpoint(
    ray_session, s3_endpoint: str, s3_bucket: str, minilm: str, tmp_path: Path, capsys
):
    model = make_tiny_bert(minilm, tmp_path / "tiny-bert")  # small checkpoints to upload
    out = f"s3://{s3_bucket}/runs/tiny"
    cfg = load_config(
        overrides=[
            f"train.data={_triplets(tmp_path / 'train.jsonl')}",
            "train.format=triplets",
            f"encoder.model={model}",
            f"train.out={out}",
            f"storage.s3_endpoint={s3_endpoint}",
            "train.batch_size=4",
            "train.max_length=32",
            "train.epochs=2",  # 8 examples, 4 per step: 4 steps
            "train.lr=1e-4",
            "train.checkpoint_every=2",
            "train.max_failures=1",
        ]
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
    assert all(np.isfinite(r["loss"]) and r["pairs_per_s"] > 0 for r in rows)
    assert summary["steps"] == 4 and len(summary["peak_memory_mb_per_worker"]) == 1
    loc = storage.resolve(f"{out}/run")
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path))
    folders = [i for i in infos if i.type == pafs.FileType.Directory]
    assert sum(i.base_name.startswith("checkpoint_") for i in folders) == 2  # steps 2 and 4

    local = tmp_path / "model"
    saved = storage.resolve(summary["model"])
    pafs.copy_files(saved.path, str(local), source_filesystem=saved.fs)
    encoder = DenseEncoder(EncoderSpec(str(local)))  # what `cpr eval --model PATH` builds
    assert encoder.spec.pooling == "mean" and encoder.encode_queries(["a"]).shape == (1, 32)

    assert run_train(cfg)["skipped"]  # a finished run is not trained again


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
    assert "not found" in error_line(result)


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
    data.write_text(data.read_text().replace("amber", "AMBER"))
    with pytest.raises(ConfigError, match="holds a run on other data or settings"):
        prepare_run(load_config(overrides=overrides), storage)
