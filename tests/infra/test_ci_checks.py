"""CI (`.ci/run`) checks style and types before the suite: `make check` runs ruff check, ruff
format --check and mypy on the package at the strictness pyproject.toml states, and a failed
check ends the run before `make test`. `make -n` prints the Makefile's real recipe; the mypy
run itself is CI's (a minute: too slow for a test)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
LINTED = "cpr_ray tests benchmarks jobs"


def _commands(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_ci_runs_the_checks_first_and_stops_on_a_failed_one():
    commands = _commands(ROOT / ".ci" / "run")
    assert "set -euo pipefail" in commands
    assert commands.index("make check") < commands.index("make test")


def test_make_check_runs_both_ruff_checks_and_mypy():
    recipe = subprocess.run(
        ["make", "-n", "check"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert f".venv/bin/ruff check {LINTED}" in recipe
    assert f".venv/bin/ruff format --check {LINTED}" in recipe
    assert ".venv/bin/mypy" in recipe  # its files and settings: pyproject.toml's [tool.mypy]


def test_mypy_checks_the_package_at_the_stated_strictness():
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["cpr_ray"]
    assert mypy["check_untyped_defs"] is True and mypy["no_implicit_optional"] is True
    assert "ignore-without-code" in mypy["enable_error_code"] and mypy["warn_unused_ignores"]
    # a missing library is forgiven only by name, never for every import at once
    assert "ignore_missing_imports" not in mypy and "ignore_errors" not in mypy
    for override in mypy["overrides"]:
        assert "ignore_errors" not in override
        modules = override["module"]
        assert all(m.strip(".*") for m in ([modules] if isinstance(modules, str) else modules))
