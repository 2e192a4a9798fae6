"""The `cpr` command: user errors are one line and exit code 2; stats reads a build."""

import subprocess
import sys

from typer.testing import CliRunner

from cpr_ray.cli import app

runner = CliRunner()


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
