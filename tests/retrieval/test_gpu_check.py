"""benchmarks/gpu_check.py at its tiny sizes on CPU, in-process: every check's row is there,
each measured figure is a real number, and each comparison is the one its row names."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = [
    "encode all-MiniLM-L6-v2, bfloat16",
    "encode Qwen3-0.6B shape (random), bfloat16",
    "train step Qwen3-0.6B, full fine-tuning",
    "train step Qwen3-4B, LoRA r 16",
    "pool search, exact top-k",
]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_gpu_check_on_cpu_gives_every_row_and_comparison(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    gpu_check = importlib.import_module("gpu_check")
    out = tmp_path / "check.json"
    report = gpu_check.main(["--json", str(out)])  # no CUDA here: tiny sizes on their own

    assert json.loads(out.read_text()) == report
    assert (report["device"], report["gpu"], report["tiny"]) == ("cpu", "n/a (CPU)", True)
    rows = {row["check"]: row for row in report["rows"]}
    assert list(rows) == CHECKS
    for row in rows.values():
        ours, baseline = row["ours"]["value"], row["baseline"]["value"]
        assert math.isfinite(ours) and ours > 0, row
        assert math.isfinite(baseline) and baseline > 0, row
        if row["comparison"]["kind"] == "ratio":
            assert row["comparison"]["value"] == pytest.approx(ours / baseline)
            assert row["comparison"]["text"] == f"{ours / baseline:.2f}×"
        else:
            assert row["comparison"]["kind"] == "% difference"
            assert row["comparison"]["value"] == pytest.approx((ours / baseline - 1) * 100)
    for check in CHECKS[:2]:  # both encoders give the same embeddings
        assert rows[check]["min_cosine"] > 0.99
        assert rows[check]["ours"]["unit"] == "docs/s"
    for check in CHECKS[2:4]:  # the CPU's own figures, never a GPU's
        assert rows[check]["ours"]["what"] == "CPU allocator peak"
        assert rows[check]["baseline"]["what"].startswith("cpr train --plan")
        step = rows[check]["step"]  # a real step: a loss, and gradients that reach the weights
        assert step["seconds"] > 0 and math.isfinite(step["loss"]) and step["grad_norm"] > 0
    assert rows[CHECKS[4]]["same_ids"] == 1.0  # the sharded search finds what faiss finds
    assert "GPU check on cpu" in capsys.readouterr().out
