"""Failures an operator can read: a stage that fails in a Ray worker leaves its record (cause,
remote traceback, no secret) under ROOT/_logs/ on a local root and on S3, the command's and the
job's last line is the cause with the record's path, and `cpr stats ROOT` shows the failure
until a success follows it.

The failing stage is a test-only stage function standing in for `venues` (the build's wiring,
the Ray worker and the storage are real): a bug or a user's mistake raised in a Ray Data task.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from cpr_ray.cpr_command import app
from cpr_ray.errors import InputError
from cpr_ray.pipeline import build
from cpr_ray.storage.store import Storage, StorageConfig

pytestmark = pytest.mark.usefixtures("ray_session")

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s2-SENTINEL-failure-4b1e9d07"  # the driver's $S2_API_KEY in these tests
SIGNED = "http://127.0.0.2:9/files/a.gz?X-Amz-Signature=SENTINELsig0b7e"
runner = CliRunner()


def _bug(batch: dict) -> dict:
    raise ZeroDivisionError(f"a bug near {SIGNED} with {SECRET}")


def _mistake(batch: dict) -> dict:
    raise InputError("shard s3://b/x.gz is corrupt: a test")


def stage_raising(udf):
    """A stage function whose Ray Data task raises in a worker."""

    def stage(cfg, storage, *, force=False):
        ray.data.range(2).map_batches(udf).materialize()
        return {}

    return stage


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def stats_output(root: str, *extra: str) -> str:
    shown = runner.invoke(app, ["stats", root, *extra], env={"COLUMNS": "400"})
    return shown.output


def job():
    path = ROOT / "jobs" / "build_dataset.py"
    spec = importlib.util.spec_from_file_location("build_dataset_job_failures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_bug_in_a_ray_worker_is_recorded_under_the_root_and_is_the_last_line(
    tmp_path, monkeypatch, capfd
):
    root = tmp_path / "build"
    monkeypatch.setenv("S2_API_KEY", SECRET)
    monkeypatch.setitem(build.STAGES, "venues", stage_raising(_bug))
    args = ["build", "--profile", "dry-run", "--stages", "venues"]
    with pytest.raises(SystemExit) as ended:
        app([*args, "--set", f"storage.root={root}"])
    assert ended.value.code == 1
    err = capfd.readouterr().err
    line = last_line(err)
    [record] = (root / "_logs").glob("venues-*.log")
    assert line == (
        "error: venues failed: ZeroDivisionError: a bug near "
        "http://127.0.0.2:9/files/a.gz?[query redacted] with [redacted] "
        f"(a bug, not your input; traceback in {record})"
    )
    text = record.read_text()
    header = text.split("\n\n", 1)[0]
    assert "stage: venues\n" in header and "kind: bug\n" in header
    assert "cause: ZeroDivisionError: a bug near" in header
    # the worker's own traceback, not only the driver's
    assert "ray::" in text and "MapBatches(_bug)() (pid=" in text and ", in _bug\n" in text
    assert SECRET not in text + err and "SENTINELsig" not in text + err

    shown = stats_output(str(root))
    assert f"last failure of venues at {header.split('time: ')[1].split()[0]} (bug): " in shown
    assert "ZeroDivisionError: a bug near" in shown and str(record) in shown


def test_on_s3_a_job_records_a_workers_mistake_and_stats_shows_it_until_a_success(
    s3_endpoint, s3_bucket, monkeypatch, capsys
):
    import boto3

    root = f"s3://{s3_bucket}/build"
    sets = ["--set", f"storage.root={root}", "--set", f"storage.s3_endpoint={s3_endpoint}"]
    monkeypatch.setitem(build.STAGES, "venues", stage_raising(_mistake))
    rc = job().main(["--profile", "dry-run", "--stages", "venues", *sets])
    assert rc == 2
    err = capsys.readouterr().err
    line = last_line(err)
    assert line.startswith("error: shard s3://b/x.gz is corrupt: a test (Ray traceback in ")
    uri = line.rsplit("Ray traceback in ", 1)[1].rstrip(")")
    assert uri.startswith(f"{root}/_logs/venues-") and "Traceback" not in err
    key = uri.removeprefix(f"s3://{s3_bucket}/")
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    text = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read().decode()
    assert "kind: user error\ncause: shard s3://b/x.gz is corrupt: a test\n" in text
    assert "in _mistake" in text and "InputError" in text

    monkeypatch.setitem(build.STAGES, "venues", stage_raising(_bug))  # a bug, later
    assert job().main(["--profile", "dry-run", "--stages", "venues", *sets]) == 1
    line = last_line(capsys.readouterr().err)
    assert line.startswith("error: venues failed: ZeroDivisionError: a bug near ")
    assert f"traceback in {root}/_logs/venues-" in line

    shown = stats_output(root, "--s3-endpoint", s3_endpoint)
    assert "last failure of venues at " in shown and "ZeroDivisionError" in shown, shown
    assert "corrupt" not in shown  # the latest failure only

    monkeypatch.setitem(build.STAGES, "venues", lambda cfg, storage, force: {"run_id": "ok"})
    assert job().main(["--profile", "dry-run", "--stages", "venues", *sets]) == 0
    shown = stats_output(root, "--s3-endpoint", s3_endpoint)
    assert "last failure" not in shown and "no published stage" in shown
    storage = Storage(StorageConfig(root=root, s3_endpoint=s3_endpoint))
    assert len(storage.list_files(f"{root}/_logs", (".log",))) == 2  # the records stay


def test_a_bug_outside_any_stage_still_ends_with_its_one_line(tmp_path, monkeypatch, capfd):
    import cpr_ray.cpr_command as cli

    def broken(*args, **kwargs):
        raise ValueError("an internal bug\nwith a second line")

    monkeypatch.setattr(cli, "run_build", broken)
    with pytest.raises(SystemExit) as ended:
        app(["build", "--profile", "dry-run", "--set", f"storage.root={tmp_path}"])
    assert ended.value.code == 1
    err = capfd.readouterr().err
    assert "Traceback" in err
    assert last_line(err) == (
        "error: ValueError: an internal bug (a bug, not your input; traceback above)"
    )


def test_a_refresh_whose_diff_file_is_cut_short_is_recorded_and_shown_by_stats(
    sample_mined, tmp_path, monkeypatch
):
    """The nightly refresh's corpus step as a stage: a diff file that breaks off fails it in a
    Ray task, in one line naming the file and its record, which `cpr stats` then shows."""
    import gzip
    import json

    from cpr_ray.config import sample_dir
    from tests.builds import NEW, OLD, copy_build
    from tests.standins.clients import S2StandIn, start_s2_standin

    root = copy_build(sample_mined, tmp_path / "build")
    proc, s2 = start_s2_standin(tmp_path / "s2", tmp_path / "s2.log")
    try:
        old, new = OLD, NEW
        (s2.root / "releases.json").write_text(json.dumps([old, new]))
        step = s2.root / "diffs" / old / new / "papers"
        step.mkdir(parents=True)
        shard = sample_dir() / "s2" / "papers" / "papers-0000.jsonl.gz"
        line = gzip.open(shard, "rt").readline()
        (step / "update-00000.jsonl.gz").write_bytes(gzip.compress((line * 50).encode())[:-40])
        monkeypatch.setenv("S2_API_KEY", S2StandIn.API_KEY)
        sets = [
            f"storage.root={root}",
            f"refresh.base_release={old}",
            f"refresh.api_url={s2.api_url}",
            "refresh.requests_per_second=50",
        ]
        args = ["refresh", "--profile", "dry-run", "--corpus-only"]
        done = runner.invoke(app, [*args, *[a for s in sets for a in ("--set", s)]])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert done.exit_code == 2, done.output
    line = last_line(done.output)
    assert line.startswith("error: shard ") and "update-00000.jsonl.gz is corrupt" in line
    [record] = (root / "_logs").glob("refresh-*.log")
    assert line.endswith(f"(Ray traceback in {record})") and "\n" not in line
    text = record.read_text()
    assert "stage: refresh\n" in text and "kind: user error\n" in text and "InputError" in text
    shown = stats_output(str(root))
    assert "last failure of refresh at " in shown and "(user error): shard " in shown, shown
    assert "last failure of mine" not in shown  # its stages all succeeded
