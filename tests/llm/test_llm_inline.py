"""Small asks answered by the driver itself (`llm.inline_max_rows`), against the scripted endpoint.

A nightly refresh asks a handful of rows per LLM stage; an actor pool costs seconds to start
for each. These tests hold the driver's path to the pool's promises: the pool's whole in-flight
limit, no Ray at all, answers kept when the driver is killed mid-ask, a refusal stopping it at
once, and an async caller (a Serve replica) served too. The driver is a child process where
the test needs one it can kill or one without Ray.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pds
import pytest

from cpr_ray.config import load_config
from cpr_ray.errors import LLMConfigError, LLMStageError
from cpr_ray.llm.ratelimit import ClusterRateLimiter
from cpr_ray.llm.spend_ledger import ledger_summary, ledger_uri
from cpr_ray.llm.step_runner import LLMContext, TaskRun, cached_note, run_llm_task
from cpr_ray.queries.usefulness import UsefulnessGrader
from cpr_ray.storage.store import Storage
from tests.builds import flushed_answers
from tests.standins.clients import ScriptedLLM

# one driver: asks `n` grader rows of the scripted endpoint, prints its stats and whether Ray ran
DRIVER = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    import ray
    from cpr_ray.config import load_config
    from cpr_ray.llm.step_runner import LLMContext, run_llm_task
    from cpr_ray.queries.usefulness import UsefulnessGrader
    from cpr_ray.storage.store import Storage

    root, url, n, *settings = sys.argv[1:]
    cfg = load_config("dry-run", env={}, overrides=[
        f"storage.root={root}", f"llm.base_url={url}", "llm.stages={}", "llm.model=scripted",
        *settings,
    ])
    rows = pa.table({
        "query": [f"how to do thing {i}?" for i in range(int(n))],
        "passage": ["good text"] * int(n),
        "mappings": ["a -> b (role)"] * int(n),
    })
    ctx = LLMContext(cfg.llm, Storage(cfg.storage), "driver")
    out = run_llm_task(ctx, UsefulnessGrader(), rows, base_url=url)
    print(json.dumps({"stats": out.stats, "ray": ray.is_initialized()}))
    """
)


def driver(root: Path, url: str, n: int, *settings: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(root), url, str(n), *settings],
        env={**os.environ, "RAY_ADDRESS": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def wait_for(
    what: str, ready, proc: subprocess.Popen, timeout: float = 60, seen=lambda: None
) -> None:
    """Poll `ready` while the driver runs; a timeout fails saying what `seen` returns then."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the driver ended before {what}: {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} in {timeout:.0f} s (seen: {seen()})")
        time.sleep(0.1)


def test_a_small_ask_goes_out_at_once_from_the_driver_without_ray(tmp_path, llm):
    """Seven rows, two actors of three in flight: the driver sends six at once (the pool's
    limit, not one actor's) and the seventh only once an answer frees a place; it starts no
    Ray, and a second run is served from the cache."""
    llm.pause()
    settings = ("llm.actors=2", "llm.max_in_flight=3")
    proc = driver(tmp_path, llm.base_url, 7, *settings)
    total = lambda: llm.stats().get("total", 0)  # noqa: E731
    try:
        wait_for("six requests in flight", lambda: total() >= 6, proc, seen=total)
    finally:
        resumed = time.time()  # the server's arrival times are this machine's wall clock too
        llm.resume()
    first = result(proc)
    assert first["ray"] is False
    assert (first["stats"]["asked"], first["stats"]["new_ok"]) == (7, 7)
    # no answer came before the resume, so a seventh request sent before it broke the limit
    arrivals = sorted(llm.stats()["arrivals"])
    assert len(arrivals) == 7 and arrivals[5] < resumed <= arrivals[6], (resumed, arrivals)
    again = result(driver(tmp_path, llm.base_url, 7, *settings))
    assert (again["stats"]["cached"], again["stats"]["asked"]) == (7, 0)
    assert llm.stats()["total"] == 7


def test_a_driver_killed_mid_ask_keeps_what_was_answered(tmp_path, llm):
    """Eight rows in one wave, four answered and four held by the endpoint: the driver is
    killed (SIGKILL, no clean-up). The answers it received had reached the cache; the rerun
    asks only the four, so the ledger holds one row per input row."""
    llm.faults(*[{"kind": "pass"}] * 4, *[{"kind": "hang"}] * 4)
    proc = driver(tmp_path, llm.base_url, 8, "llm.actors=1", "llm.max_in_flight=8")
    try:
        wait_for("four answers", lambda: llm.stats().get("answered", 0) >= 4, proc)
        assert llm.stats()["total"] == 8
        # the four answers reach the cache, then the ledger, at most one flush (FLUSH_S) behind
        stored = lambda: flushed_answers(tmp_path, "score-positives")  # noqa: E731
        wait_for(
            "four answers in the cache and ledger", lambda: stored() == (4, 4), proc, seen=stored
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    llm.reset()
    rerun = result(driver(tmp_path, llm.base_url, 8, "llm.actors=1", "llm.max_in_flight=8"))
    assert (rerun["stats"]["cached"], rerun["stats"]["asked"]) == (4, 4)
    storage = Storage(load_config(env={}, overrides=[f"storage.root={tmp_path}"]).storage)
    ledger = pds.dataset(ledger_uri(storage, "score-positives")).to_table()
    assert ledger.num_rows == 8 and set(ledger["status"].to_pylist()) == {"ok"}


def _context(root: Path, url: str, *settings: str) -> LLMContext:
    cfg = load_config(
        "dry-run",
        env={},
        overrides=[
            f"storage.root={root}",
            f"llm.base_url={url}",
            "llm.stages={}",
            "llm.model=scripted",
            *settings,
        ],
    )
    return LLMContext(cfg.llm, Storage(cfg.storage), "test")


def _rows(n: int) -> pa.Table:
    return pa.table(
        {
            "query": [f"question {i}?" for i in range(n)],
            "passage": ["good text"] * n,
            "mappings": ["a -> b (role)"] * n,
        }
    )


def _ask(root: Path, llm: ScriptedLLM, n: int, *settings: str) -> TaskRun:
    """`n` grader rows through `run_llm_task` in this process."""
    ctx = _context(root, llm.base_url, *settings)
    return run_llm_task(ctx, UsefulnessGrader(), _rows(n), base_url=llm.base_url)


def test_a_refusal_mid_ask_stops_the_driver_at_once(tmp_path, llm):
    """The probe passes (no /models auth), then the chat requests are refused: one error, and
    the rows not yet sent are never sent. One request at a time, so they can be counted."""
    llm.faults(*[{"kind": "401"}] * 20)
    settings = ("llm.actors=1", "llm.max_in_flight=1", "llm.inline_max_rows=6")
    with pytest.raises(LLMConfigError, match=r"refused the API key \(HTTP 401\)"):
        _ask(tmp_path, llm, 6, *settings)
    assert llm.stats()["total"] == 1


def test_an_async_caller_is_answered_too(tmp_path, llm):
    """A caller that runs its own event loop (a Serve replica's method) gets its answers: the
    ask runs on a thread of its own rather than failing on the running loop."""
    ctx = _context(tmp_path, llm.base_url, "llm.actors=1", "llm.max_in_flight=4")
    stats: dict = {}

    async def caller() -> None:
        out = run_llm_task(ctx, UsefulnessGrader(), _rows(3), base_url=llm.base_url)
        stats.update(out.stats)

    llm.pause()
    thread = threading.Thread(target=asyncio.run, args=(caller(),))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while llm.stats().get("total", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "cpr-llm-inline" in {t.name.rsplit("_", 1)[0] for t in threading.enumerate()}
    finally:
        llm.resume()
        thread.join(timeout=60)
    assert (stats["asked"], stats["new_ok"]) == (3, 3)


def test_a_failing_endpoint_stops_a_many_wave_ask_early_with_progress_on_the_way(
    tmp_path, llm, capfd
):
    """200 rows, two in flight, every answer an HTTP 500: the driver reports progress every 64
    answers as a pool's stage does, and the first report's rate check stops it, long before
    the 200th request."""
    llm.faults({"kind": "500", "always": True})
    llm.latency(20)
    settings = (
        "llm.actors=1",
        "llm.max_in_flight=2",
        "llm.max_retries=0",
        "llm.min_calls_for_failure_rate=10",
    )
    with pytest.raises(LLMStageError, match=r"score-positives: \d+ of \d+ calls .* failed"):
        _ask(tmp_path, llm, 200, *settings)
    out = capfd.readouterr().err  # the console is stderr
    assert "200 to ask scripted" in out and "from this process" in out
    assert "64/200 asked" in out
    assert llm.stats()["total"] < 100


@pytest.mark.usefixtures("ray_session")
def test_the_shared_rate_limit_paces_the_driver_too(tmp_path, llm):
    """The driver's ask waits for the same shared limiter (a Ray actor) as a pool's actors:
    four requests at two a second get starts half a second apart, and none is sent before its
    start (a busy machine only sends them later)."""
    import ray

    # the test holds the limiter the ask finds by name, so it outlives the ask to be read
    limiter = ClusterRateLimiter(2.0, None).start()
    settings = ("llm.requests_per_second=2", "llm.max_in_flight=4")
    out = _ask(tmp_path, llm, 4, *settings)
    assert out.stats["new_ok"] == 4
    starts = sorted(ray.get(ray.get_actor(limiter.name).starts.remote()))
    assert len(starts) == 4
    assert all(b - a >= 0.5 - 1e-6 for a, b in zip(starts, starts[1:])), starts
    arrivals = sorted(llm.stats()["arrivals"])
    assert len(arrivals) == 4
    assert all(arrived >= start - 0.05 for arrived, start in zip(arrivals, starts)), arrivals


def test_prompt_cache_hits_the_endpoint_reports_reach_the_ledger_summary_and_cost(
    tmp_path, llm, capsys
):
    """An endpoint that reports `usage.prompt_tokens_details.cached_tokens` (vLLM's prefix
    cache, a provider's prompt cache): the hits land in the ledger, the stage's stats and
    summary lines, and are paid at the cached price. Rows whose prompts open alike (a grader's
    question) are asked one after another, whatever their order in the table, so the cache
    still holds that start; each row keeps its own answer."""
    llm.prompt_cache(20)
    prices = (
        "llm.prices.scripted.input_per_mtok=1000",
        "llm.prices.scripted.cached_input_per_mtok=100",
    )
    ctx = _context(tmp_path, llm.base_url, *prices, "llm.actors=1", "llm.max_in_flight=1")
    rows = pa.table(
        {
            "query": ["how to b?", "how to a?", "how to b?", "how to a?"],
            "passage": ["good text 1", "good text 2", "good text 3", "USELESS"],
            "mappings": ["a -> b (role)"] * 4,
        }
    )
    out = run_llm_task(ctx, UsefulnessGrader(), rows, base_url=llm.base_url)
    line = lambda p, label: p.split(f"{label}: ")[1].split("\n")[0]  # noqa: E731
    asked = [(line(p, "Question"), line(p, "Passage")) for p in llm.prompts()]
    assert asked == [
        ("how to a?", "good text 2"),
        ("how to a?", "USELESS"),
        ("how to b?", "good text 1"),
        ("how to b?", "good text 3"),
    ]
    assert out.table["passage"].to_pylist() == rows["passage"].to_pylist()
    assert out.table["usefulness"].to_pylist() == [3, 3, 3, 1]
    prompt = out.stats["prompt_tokens"]
    assert out.stats["cached_prompt_tokens"] == 4 * 20 < prompt
    assert out.stats["cost_usd"] == pytest.approx((prompt - 80) / 1e3 + 80 / 1e4, abs=1e-6)
    progress = " ".join(capsys.readouterr().err.split())  # the console's lines, unwrapped
    assert f"tokens {prompt:,} in (80 cached) / " in progress
    (summary,) = ledger_summary(ctx.storage, ctx.llm)
    assert (summary["stage"], summary["cached_prompt_tokens"]) == ("score-positives", 80)
    assert summary["cost_usd"] == pytest.approx(out.stats["cost_usd"], abs=1e-6)
    assert cached_note(summary) == " (80 cached)" and cached_note({"cached_prompt_tokens": 0}) == ""
