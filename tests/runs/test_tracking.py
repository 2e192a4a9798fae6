"""Side services never stop a run: where MLflow tracking logs (`cpr_ray.runs.tracking.store_uri`),
the
one line a user who asked for tracking without the extra gets, and the one line each failing
store, the progress file or the live metrics cost (`cpr_ray.runs.side_services`). (A training and
its evaluations read back from a real store: tests/cards/test_model_card.py; a restarted two-worker
run, and a server that does not answer: tests/train/test_train_ray.py.)"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cpr_ray.config import TrackingConfig, load_config
from cpr_ray.runs import prometheus as metrics
from cpr_ray.runs import side_services, tracking
from cpr_ray.runs.progress import ProgressWriter
from cpr_ray.storage.store import Storage, StorageConfig


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


@contextmanager
def _answering_500() -> Iterator[str]:
    """A tracking server that answers every request with 500."""

    class Handler(BaseHTTPRequestHandler):
        def _fail(self) -> None:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _fail

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


def _start(tmp_path: Path, uri: str) -> tracking.TrackedRun | None:
    """What `cpr train` does first with tracking: `start_training` on a local OUT."""
    cfg = load_config("dry-run", overrides=[f"tracking.uri={uri}"], env={})
    out = str(tmp_path / "run")
    return tracking.start_training(cfg, Storage(cfg.storage), out, {"a": 1})


def test_a_file_store_mlflow_refuses_is_one_line_saying_what_to_change(tmp_path, capsys):
    """MLflow 3 refuses its file store (the `mlruns` folder most users already have) with an
    exception: training goes on untracked after one `tracking:` line naming both ways out."""
    store = tmp_path / "mlruns"
    assert _start(tmp_path, f"file://{store}") is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tracking: cannot log to file://{store}: ")
    assert f"sqlite:///{tmp_path}/mlruns.db" in line and "MLFLOW_ALLOW_FILE_STORE=true" in line
    assert line.endswith("going on untracked")
    assert not (tmp_path / "run" / "mlflow.json").exists()  # no run recorded for a resume


def test_a_tracking_server_answering_500_is_one_line_and_the_run_goes_on(tmp_path, capsys):
    with _answering_500() as url:
        assert _start(tmp_path, url) is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tracking: starting a run failed at {url}: ")
    assert line.endswith(
        "(check the tracking server, or set tracking.enabled=false); going on untracked"
    )


def test_a_locked_sqlite_store_is_one_line_naming_the_way_out(tmp_path, capsys):
    """The advice for each store that fails most, from the error MLflow raises. (A store held
    locked for real costs MLflow's own 20 s of retries: the message below is what it raised.)"""
    locked = "(sqlite3.OperationalError) database is locked"
    assert tracking._advice("sqlite:////x/mlruns.db", RuntimeError(locked)) == (
        " (another process holds the SQLite store: give this run its own tracking.uri); "
        "going on untracked"
    )


def test_a_progress_file_that_cannot_be_written_is_one_line_and_the_stage_goes_on(
    tmp_path, capsys, monkeypatch
):
    """The progress file is for watching: a root it cannot write under (here a file where its
    folder should be) costs one line, said once, and nothing else."""
    monkeypatch.setattr(side_services, "_said", set())
    (tmp_path / "_progress").write_text("not a folder")
    writer = ProgressWriter(Storage(StorageConfig(root=str(tmp_path))), "mine", "r1")
    writer.start()
    writer.step("pairs", 5, 10)
    writer.finish("done")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"progress: writing {tmp_path}/_progress/mine.json failed (")
    assert line.endswith("`cpr stats --watch` will not follow this run; it goes on")


def test_a_metric_the_metrics_library_refuses_is_one_line_and_the_run_goes_on(capsys, monkeypatch):
    """Ray's metrics refuse a tag that is not a string (a stage asked with no model name):
    the asker goes on, and says so once."""
    monkeypatch.setattr(side_services, "_said", set())
    for _ in range(2):
        metrics._inc("cpr_llm_answers", 1, {"stage": "dedup", "model": None})  # type: ignore[dict-item]
        metrics._set("cpr_llm_rows_todo", 3, {"stage": "dedup", "model": None})  # type: ignore[dict-item]
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "metrics: recording live metrics failed (Tag values must be str, got <class "
        "'NoneType'>.); Prometheus misses this process's cpr_ series; the run goes on"
    )
