"""The `cpr` command: user errors are one line and exit code 2; stats reads a build."""

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from cpr_ray.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def test_build_with_bad_config_key_fails_before_work(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("profile: dry-run\ningest:\n  buckets: 4\n")
    result = runner.invoke(app, ["build", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "ingest.buckets: unknown key" in result.output
    assert "Traceback" not in result.output


def test_build_with_unknown_stage(tmp_path):
    result = runner.invoke(
        app,
        [
            "build",
            "--profile",
            "dry-run",
            "--stages",
            "ingest,bogus",
            "--set",
            f"storage.root={tmp_path}",
        ],
    )
    assert result.exit_code == 2
    assert "unknown stage(s) bogus" in result.output


def test_stats_on_empty_root(tmp_path):
    result = runner.invoke(app, ["stats", str(tmp_path)])
    assert result.exit_code == 2
    assert "no published stage" in result.output


def test_console_script_is_installed():
    out = subprocess.run(
        [sys.executable, "-m", "cpr_ray.cli", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for command in ("dry-run", "build", "stats", "eval", "report"):
        assert command in out.stdout


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_an_unknown_key_is_one_line_and_exit_2_for_the_job_and_for_eval(tmp_path):
    job = _run("jobs/build_dataset.py", "--profile", "dry-run", "--set", "ingest.nope=1")
    assert job.returncode == 2
    assert job.stderr.strip().splitlines() == [
        "error: invalid config: ingest.nope: unknown key; allowed here: batch_size, "
        "cpus_per_task, lance_fragment_rows, max_reject_rate, num_buckets, on_corrupt_shard, "
        "raw_line_limit"
    ]
    evaluation = _run(
        "-m", "cpr_ray.cli", "eval", "--benchmark", "cpr", "--data", str(tmp_path),
        "--retriever", "bm25", "--set", "eval.nope=1",
    )  # fmt: skip
    assert evaluation.returncode == 2
    lines = evaluation.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid config: eval.nope: unknown key")
    assert "Traceback" not in evaluation.stdout + evaluation.stderr


def test_a_bug_is_not_dressed_as_a_user_error(tmp_path, monkeypatch):
    """Only `UserError`s are one line and exit 2: a ValueError from inside is a bug's traceback."""
    import cpr_ray.cli as cli

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(cli, "run_build", broken)
    result = runner.invoke(
        app, ["build", "--profile", "dry-run", "--set", f"storage.root={tmp_path}"]
    )
    assert result.exit_code == 1
    assert isinstance(result.exception, ValueError)
