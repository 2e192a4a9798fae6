"""An LLM stage under a misbehaving endpoint, as a user meets it through `cpr build`.

Each test breaks one promise the docs make the way a user would: an endpoint that is not
listening, one that answers 500 or 401 to everything, HTML or prose with HTTP 200, a few
failures among many answers, Ctrl-C in the middle of a stage. The mined sample build is the
session's (`sample_mined`), copied per test, so every test starts from published `mine` output.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyarrow.dataset as pds
import pytest
from typer.testing import CliRunner

from cpr_ray.config import load_config
from cpr_ray.cpr_command import app
from cpr_ray.llm.ratelimit import ClusterRateLimiter
from cpr_ray.llm.spend_ledger import ledger_uri
from cpr_ray.storage.store import Storage
from tests.builds import copy_build
from tests.standins.launch import CPR

pytestmark = pytest.mark.usefixtures("ray_session")

ROWS = 8


@pytest.fixture()
def build(sample_mined: Path, tmp_path: Path) -> Path:
    return copy_build(sample_mined, tmp_path / "build")


def cpr_build(root: Path, base_url: str, *extra: str) -> tuple[int, str]:
    """`cpr build --stages judge-analogy` on the copied build, the scripted model by name."""
    result = CliRunner().invoke(
        app,
        [
            "build",
            "--profile",
            "dry-run",
            "--stages",
            "judge-analogy",
            "--llm-base-url",
            base_url,
            "--llm-model",
            "scripted",
            "--set",
            "llm.stages={}",
            "--set",
            f"storage.root={root}",
            "--set",
            f"llm.max_rows_per_stage={ROWS}",
            "--set",
            "llm.max_in_flight=4",
            "--set",
            "llm.max_retries=1",
            "--set",
            "llm.backoff_base_s=0.05",
            *extra,
        ],
        env={"COLUMNS": "400"},
    )
    return result.exit_code, result.output


def published(root: Path, stage: str = "judge-analogy") -> dict | None:
    path = root / stage / "_MANIFEST.json"
    return json.loads(path.read_text()) if path.exists() else None


def fails(root: Path, base_url: str, *extra: str, stage: str = "judge-analogy") -> str:
    """Run the stage, expecting the one-line failure a user should see; returns that line."""
    code, out = cpr_build(root, base_url, *extra)
    assert code == 2, out
    lines = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in out, out
    assert published(root, stage) is None  # nothing a rerun could skip
    return lines[0]


def test_endpoint_not_listening_stops_the_stage_with_one_line(build):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens once closed
    line = fails(build, dead)
    assert f"cannot reach the LLM endpoint {dead}" in line and "check llm.base_url" in line


def test_http_500_every_time_publishes_nothing_and_a_rerun_asks_again(build, llm):
    llm.faults({"kind": "500", "always": True})
    line = fails(build, llm.base_url)
    assert f"{ROWS} of {ROWS} calls to {llm.base_url} failed" in line
    assert "HTTP 500: " in line and "llm.max_failure_rate=20%" in line

    llm.reset()  # the endpoint is fixed
    code, out = cpr_build(build, llm.base_url)
    assert code == 0, out
    stats = published(build)["stats"]
    assert stats["asked"] == ROWS and stats["new_failed"] == 0


def test_a_refused_key_stops_at_the_first_401_not_per_row(build, llm):
    llm.faults({"kind": "401", "always": True})
    assert "refused the API key (HTTP 401)" in fails(build, llm.base_url)
    assert llm.stats().get("total", 0) == 0  # the probe saw it: no row was sent


def test_a_key_refused_mid_stage_stops_the_stage(build, llm):
    """The probe passes (no /models auth), then chat requests are refused: one line, exit 2.
    One request at a time, so that what is sent after the first refusal can be counted."""
    llm.faults(*[{"kind": "401"}] * 50)
    one_at_a_time = ("--set", "llm.actors=1", "--set", "llm.max_in_flight=1")
    assert "refused the API key (HTTP 401)" in fails(build, llm.base_url, *one_at_a_time)
    assert llm.stats()["total"] == 1  # stopped at the first refusal, not asked row by row


def test_an_html_page_with_http_200_is_an_endpoint_error(build, llm):
    llm.faults({"kind": "html", "always": True})
    line = fails(build, llm.base_url)
    assert "not OpenAI-compatible JSON" in line and "Welcome to nginx" in line


def test_prose_answers_are_ledgered_but_never_served_from_the_cache(build, llm):
    llm.faults({"kind": "prose", "always": True})
    # the dry run tolerates invalid answers (its placeholder judge writes many) ...
    code, out = cpr_build(build, llm.base_url)
    assert code == 0, out
    assert published(build)["stats"]["new_invalid"] == ROWS
    storage = Storage(load_config(env={}, overrides=[f"storage.root={build}"]).storage)
    ledger = pds.dataset(ledger_uri(storage, "judge-analogy")).to_table()
    assert ledger.num_rows == ROWS and set(ledger["status"].to_pylist()) == {"invalid"}

    # ... but a fixed endpoint is asked again, even without --force: nothing invalid was cached
    llm.reset()
    code, out = cpr_build(build, llm.base_url, "--force")
    assert code == 0, out
    stats = published(build)["stats"]
    assert stats["cached"] == 0 and stats["asked"] == ROWS and stats["new_ok"] > 0


def test_invalid_answers_past_their_limit_stop_the_stage(build, llm):
    """Outside the dry run's tolerance, the same prose answers stop the stage."""
    llm.faults({"kind": "prose", "always": True})
    line = fails(build, llm.base_url, "--set", "llm.max_invalid_rate=0.2")
    assert f"{ROWS} of {ROWS} calls to {llm.base_url} invalid" in line
    assert "llm.max_invalid_rate=20%" in line and "holds no JSON object" in line


def test_the_failure_gate_is_checked_at_the_end_whatever_the_count(build, llm):
    """3 of 8 failing is below min_calls_for_failure_rate, and still stops the stage."""
    llm.faults(*[{"kind": "pass"}] * 5, *[{"kind": "500"}] * 10)
    assert "3 of 8 calls" in fails(build, llm.base_url, "--set", "llm.max_in_flight=1")


def test_a_run_with_failures_is_never_reused_as_final(build, llm):
    llm.faults(*[{"kind": "pass"}] * 7, *[{"kind": "500"}] * 2)
    one_at_a_time = ("--set", "llm.max_in_flight=1", "--set", "llm.max_failure_rate=0.5")
    code, out = cpr_build(build, llm.base_url, *one_at_a_time)
    assert code == 0, out
    first = published(build)
    assert first["complete"] is False and first["stats"]["new_failed"] == 1
    # same inputs, same config: still not skipped; only the failed row is asked
    code, out = cpr_build(build, llm.base_url, *one_at_a_time)
    assert code == 0, out
    assert "was incomplete; running again" in out
    second = published(build)
    assert second["complete"] is True
    assert second["stats"]["cached"] == ROWS - 1 and second["stats"]["asked"] == 1
    # and now it is final
    code, out = cpr_build(build, llm.base_url, *one_at_a_time)
    assert "skipped" in out and published(build)["run_id"] == second["run_id"]


def test_the_dry_run_tolerates_only_invalid_answers():
    cfg = load_config("dry-run", env={})
    assert cfg.llm.max_invalid_rate == 1.0
    assert cfg.llm.max_failure_rate == load_config(env={}).llm.max_failure_rate < 1.0


@pytest.mark.parametrize("inline_max_rows", [ROWS, 0], ids=["from-the-driver", "actor-pool"])
def test_ctrl_c_mid_stage_keeps_every_answer_received(build, llm, inline_max_rows):
    """6 of 8 answered, 2 hanging: SIGINT, then a rerun pays only for the 2 missing, whether
    the driver asked them itself (a small ask) or an actor pool did."""
    llm.faults(*[{"kind": "pass"}] * 6, {"kind": "hang"}, {"kind": "hang"})
    cmd = [
        *CPR, "build", "--profile", "dry-run",
        "--stages", "judge-analogy", "--llm-base-url", llm.base_url, "--llm-model", "scripted",
        "--set", "llm.stages={}", "--set", f"storage.root={build}",
        "--set", f"llm.max_rows_per_stage={ROWS}",
        "--set", f"llm.max_in_flight={ROWS}", "--set", "ray.num_cpus=1",
        "--set", f"llm.inline_max_rows={inline_max_rows}",
    ]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ""}
    # its output to a file, not a pipe nobody reads until it exits: past the pipe's 64 KiB (Ray's
    # warnings on a loaded machine) the command would block writing and never exit
    log = build.parent / "build.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Ctrl-C as a terminal sends it: a runner that started the tests in the background
            # hands its children SIGINT ignored, and Python then keeps it ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    storage = Storage(load_config(env={}, overrides=[f"storage.root={build}"]).storage)
    ledger = ledger_uri(storage, "judge-analogy")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if Path(ledger).is_dir() and pds.dataset(ledger).count_rows() >= 6:
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        else:
            pytest.fail("the six answers never reached the ledger")
        assert llm.stats()["total"] == ROWS  # all eight asked, two still hanging
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("no exit 60 s after Ctrl-C; its output ends:\n" + log.read_text()[-3000:])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert published(build) is None
    asked_before = llm.stats()["total"]

    llm.reset()
    code, out = cpr_build(build, llm.base_url)
    assert code == 0, out
    stats = published(build)["stats"]
    assert stats["cached"] == 6 and stats["asked"] == 2
    assert llm.stats()["total"] == 2 and asked_before == ROWS


def test_the_shared_rate_limit_paces_a_whole_stage(build, llm):
    code, out = cpr_build(
        build,
        llm.base_url,
        "--set",
        "llm.requests_per_second=4",
        "--set",
        "llm.actors=2",
        "--set",
        "llm.inline_max_rows=0",  # an actor pool, so that two processes share the limit
    )
    assert code == 0, out
    # what the shared limiter decided: 8 starts across two actors, each a quarter second (or,
    # on a slow machine, more) after the one before; and no request arrived before its start
    import ray

    starts = sorted(ray.get(ray.get_actor(ClusterRateLimiter(4.0, None).name).starts.remote()))
    assert len(starts) == ROWS
    assert all(b - a >= 0.25 - 1e-6 for a, b in zip(starts, starts[1:])), starts
    arrivals = sorted(llm.stats()["arrivals"])
    assert len(arrivals) == ROWS
    assert all(arrived >= start - 0.05 for arrived, start in zip(arrivals, starts))


def test_a_failed_llm_stage_as_a_job_ends_with_the_same_one_line(build, llm, capsys):
    """What `ray job submit … -- python jobs/build_dataset.py` prints when a stage's calls fail."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "jobs" / "build_dataset.py"
    spec = importlib.util.spec_from_file_location("build_dataset_job", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    llm.faults({"kind": "500", "always": True})
    rc = job.main(
        [
            "--profile", "dry-run", "--stages", "judge-analogy",
            "--set", f"storage.root={build}", "--set", f"llm.base_url={llm.base_url}",
            "--set", "llm.model=scripted", "--set", f"llm.max_rows_per_stage={ROWS}",
            "--set", "llm.max_retries=0", "--set", "llm.stages={}",
        ]
    )  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err  # progress lines, then the one error line
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: judge-analogy: 8 of 8 calls to ")
    assert err.strip().splitlines()[-1] == errors[0] and "Traceback" not in err
    assert published(build) is None


# the scripted model at a price that makes every answer cost dollars (a prompt is ~1k tokens)
PRICED = ("--set", "llm.prices.scripted.input_per_mtok=10000",
          "--set", "llm.prices.scripted.output_per_mtok=10000")  # fmt: skip


def ledger_rows(root: Path, stage: str = "judge-analogy") -> int:
    storage = Storage(load_config(env={}, overrides=[f"storage.root={root}"]).storage)
    return pds.dataset(ledger_uri(storage, stage)).count_rows()


def test_the_build_cap_counts_what_earlier_stages_spent(build, llm):
    """judge-analogy spends S uncapped; judge-transfer under llm.max_usd below S asks nothing
    (the earlier stage's ledger counts), names the root's spend and the cap; with a cap above
    S it asks and publishes, judge-analogy skipped either way (a cap reruns nothing)."""
    code, out = cpr_build(build, llm.base_url, *PRICED)
    assert code == 0, out
    spent = published(build)["stats"]["cost_usd"]
    assert spent > 1
    both = ("--stages", "judge-analogy,judge-transfer")

    llm.reset()
    under = ("--set", f"llm.max_usd={spent / 2:.2f}")
    line = fails(build, llm.base_url, *PRICED, *both, *under, stage="judge-transfer")
    assert (
        f"error: judge-transfer: stopped at the spend cap: ${spent:,.2f} spent (every LLM "
        f"answer in the ledgers of {build}" in line
    ), line
    assert f"$0.00 by this run) against llm.max_usd=${spent / 2:,.2f}" in line
    assert llm.stats().get("total", 0) == 0  # not one request

    above = ("--set", f"llm.max_usd={spent * 100:.2f}")
    code, out = cpr_build(build, llm.base_url, *PRICED, *both, *above)
    assert code == 0, out
    assert "judge-analogy[/]: skipped" in out or "judge-analogy: skipped" in out
    analogies = published(build)["tables"]["analogies"]["rows"]
    transfer = published(build, "judge-transfer")["stats"]
    assert transfer["asked"] == analogies > 0 and llm.stats()["total"] == analogies
