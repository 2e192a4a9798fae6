"""Where MLflow tracking logs (`cpr_ray.tracking.store_uri`), and the one line a user who asked
for tracking without the extra gets. (A training and its evaluations read back from a real
store: tests/test_model_card.py; a restarted two-worker run, and a server that does not answer:
tests/test_train_ray.py.)"""

from __future__ import annotations

import sys

import pytest

from cpr_ray import tracking
from cpr_ray.config import TrackingConfig


def test_the_store_is_the_configs_then_the_environments_then_one_beside_local_outputs(
    monkeypatch, tmp_path
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = str(tmp_path / "run")
    assert tracking.store_uri(TrackingConfig(), out) == f"sqlite:///{out}/mlruns.db"
    assert tracking.store_uri(TrackingConfig(), "s3://bucket/run") is None  # no SQLite on S3
    assert tracking.store_uri(TrackingConfig(enabled=False), out) is None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert tracking.store_uri(TrackingConfig(), "s3://bucket/run") == "http://env:5000"
    assert tracking.store_uri(TrackingConfig(uri="http://cfg:5000"), out) == "http://cfg:5000"
    assert tracking.store_uri(TrackingConfig(uri="http://cfg:5000", enabled=False), out) is None


def test_without_mlflow_asking_for_tracking_says_which_extra_and_nothing_else(
    monkeypatch, capsys: pytest.CaptureFixture
):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not installed: its import fails
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.open_run(TrackingConfig(), "sqlite:////tmp/x.db") is None  # the default
    assert capsys.readouterr().err == ""
    asked = TrackingConfig(uri="http://mlflow:5000")
    assert tracking.open_run(asked, asked.uri) is None
    (line,) = capsys.readouterr().err.splitlines()
    assert "pip install 'cpr-ray[tracking]'" in line
