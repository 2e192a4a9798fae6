"""`cpr stats ROOT --watch` follows a running build from its root alone (no Ray connection): the
stage under way with its rows done of rows to do, then its end, with the LLM spend set against
the projection `cpr judge-check --root` stored; and it stops by itself when the build ends."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from cpr_ray.config import load_config
from cpr_ray.judge_check.projection import store_report
from cpr_ray.runs.progress import read_progress
from cpr_ray.storage.leases import owner_uri
from cpr_ray.storage.store import Storage, StorageConfig
from tests.builds import copy_build
from tests.llm.test_llm_reliability import cpr_build
from tests.standins.launch import CPR

ROWS = 12


def test_the_watch_follows_a_running_llm_stage_to_its_end(sample_mined, llm, tmp_path):
    root = copy_build(sample_mined, tmp_path / "build")
    storage = Storage(StorageConfig(root=str(root)))
    projection = {"projection": {"total": {"usd": 12.5}}}  # as `cpr judge-check --root` stores
    store_report(load_config("dry-run", env={}), str(root), projection)
    llm.latency(600)  # 12 rows one at a time: ~7 s, past one of the progress file's 5 s beats
    built: list[tuple[int, str]] = []
    extra = ["--set", f"llm.max_rows_per_stage={ROWS}", "--set", "llm.max_in_flight=1"]
    builder = threading.Thread(target=lambda: built.append(cpr_build(root, llm.base_url, *extra)))
    try:
        builder.start()
        deadline = time.time() + 60
        while not storage.exists(owner_uri(storage)) and time.time() < deadline:
            time.sleep(0.05)
        watch = ["stats", str(root), "--watch", "--interval", "0.2"]
        watcher = subprocess.run(
            [*CPR, *watch],
            env={**os.environ, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        builder.join(timeout=120)
        llm.latency(0)
    assert built and built[0][0] == 0, built
    out = watcher.stdout
    assert watcher.returncode == 0, out + watcher.stderr
    assert "running: build build-" in out  # the owner lease names the build
    shown = [line.split("│") for line in out.splitlines() if "judge-analogy" in line]
    states = [[cell.strip() for cell in row[1:]] for row in shown]
    running = [s for s in states if s[1] == "running"]
    assert running and all(s[2] == "judge-analogy" for s in running), states
    counts = {tuple(int(n) for n in s[3].split("/")) for s in running}
    assert (0, ROWS) in counts and any(0 < done < ROWS for done, _ in counts), counts
    # the last look comes after the build released the root, and shows the stage published
    assert "no build or refresh is running" in out.rsplit("running: build", 1)[1]
    assert states[-1][1] == "done"
    assert "of $12.50 projected by cpr judge-check" in out
    final = read_progress(storage)["judge-analogy"]
    assert (final.state, final.done, final.total) == ("done", ROWS, ROWS)


def test_watching_a_root_that_holds_no_build_is_one_line(tmp_path):
    """A mistyped root is said, not shown as an empty table that waits for nothing."""
    from typer.testing import CliRunner

    from cpr_ray.cpr_command import app

    result = CliRunner().invoke(app, ["stats", str(tmp_path / "typo"), "--watch"])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: no build under {tmp_path / 'typo'}"), result.output
