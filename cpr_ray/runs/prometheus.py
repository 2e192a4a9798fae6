"""What a build is doing, live, on Ray's metrics endpoint (and so in Prometheus and Grafana).

`cpr stats` reads the ledgers once a stage is done; these say it while it runs: how fast an LLM
stage asks, what it has spent, how much the cache saved, how many answers come back invalid or
failed, how many rows are left. Each is a `ray.util.metrics` object, made once per process on
first use and recorded by the process where the event happens (an LLM actor, the driver's own
asker, the driver), so Ray's agent on every node exports them beside Ray's own metrics with no
set-up of ours: Prometheus sees `ray_` + the name here (`_total` added to a counter), one series
per process; `infra/grafana/cpr-llm.json` sums them by stage and model.

The counters of answers are recorded where the answers are written to the ledger, from the very
rows written, so over a stage they equal its ledger (`runner.ledger_summary`). Outside Ray (an
asker used by a process that never started or joined Ray) nothing is recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.util.metrics import Counter, Gauge

from cpr_ray.runs.side_services import side_failure

LLM_TAGS = ("stage", "model")

# name -> description; every counter is tagged by stage and model
LLM_COUNTERS = {
    "cpr_llm_answers": "Rows answered (any status), as written to the ledger.",
    "cpr_llm_requests": "HTTP requests sent to the LLM endpoint (re-asks and retries included).",
    "cpr_llm_prompt_tokens": "Prompt tokens the endpoint reported.",
    "cpr_llm_completion_tokens": "Completion tokens the endpoint reported.",
    "cpr_llm_usd": "USD spent, the tokens at llm.prices (unpriced models: 0).",
    "cpr_llm_cache_hits": "Requests not sent: a valid answer was already in the stage's cache.",
    "cpr_llm_invalid": "Rows answered against the contract after every re-ask (status invalid).",
    "cpr_llm_retries": "Requests retried after a transport error, a 429 or a 5xx.",
    "cpr_llm_failures": "Rows the endpoint never answered (status failed).",
}
LLM_GAUGES = {
    "cpr_llm_rows_done": "Rows of the current ask answered so far (set by its driver).",
    "cpr_llm_rows_todo": "Rows the current ask sends (the rest were in the cache).",
    "cpr_llm_in_flight": "Rows being asked right now, per asking process.",
}
STAGE_COUNTERS = {
    "cpr_stage_rows": "Rows of the tables a stage published (tagged by stage and table).",
}
STAGE_TAGS = ("stage", "table")


def exported_names() -> set[str]:
    """The names Prometheus sees: Ray prefixes `ray_`, and a counter ends in `_total`."""
    counters = {**LLM_COUNTERS, **STAGE_COUNTERS}
    return {f"ray_{n}_total" for n in counters} | {f"ray_{n}" for n in LLM_GAUGES}


@cache
def _metrics() -> dict[str, Counter | Gauge]:
    made: dict[str, Counter | Gauge] = {
        n: Counter(n, d, tag_keys=LLM_TAGS) for n, d in LLM_COUNTERS.items()
    }
    made |= {n: Gauge(n, d, tag_keys=LLM_TAGS) for n, d in LLM_GAUGES.items()}
    made |= {n: Counter(n, d, tag_keys=STAGE_TAGS) for n, d in STAGE_COUNTERS.items()}
    return made


def _gauge(name: str) -> Gauge:
    gauge = _metrics()[name]
    assert isinstance(gauge, Gauge), f"{name} is a counter"  # names are this module's
    return gauge


def _lost(exc: Exception) -> None:
    side_failure(
        "metrics",
        "recording live metrics",
        exc,
        "Prometheus misses this process's cpr_ series; the run goes on",
    )


def _inc(name: str, value: float, tags: Mapping[str, str]) -> None:
    if value > 0:  # a counter refuses 0
        try:
            counter = _metrics()[name]
            assert isinstance(counter, Counter), f"{name} is a gauge"  # names are this module's
            counter.inc(value, tags=dict(tags))
        except Exception as exc:  # noqa: BLE001 - live metrics never stop a run
            _lost(exc)


# every gauge value this process has set, re-set each REFRESH_S: Ray's agent drops a gauge
# series that is not reported again within two export intervals (so that a dead worker's
# series go), and a stage waiting a minute on one block of answers is still asking
REFRESH_S = 1.0
_gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
_gauges_lock = threading.Lock()  # the driver's asker runs on a thread of its own
_refresher: threading.Thread | None = None


def _set(name: str, value: float, tags: Mapping[str, str]) -> None:
    global _refresher
    with _gauges_lock:
        _gauges[(name, tuple(sorted(tags.items())))] = value
        if _refresher is None:
            _refresher = threading.Thread(target=_refresh, name="cpr-metrics", daemon=True)
            _refresher.start()
    try:
        _gauge(name).set(value, tags=dict(tags))
    except Exception as exc:  # noqa: BLE001 - live metrics never stop a run
        _lost(exc)


def _refresh() -> None:
    while True:
        time.sleep(REFRESH_S)
        if not ray.is_initialized():  # shut down (and maybe started again later)
            continue
        with _gauges_lock:
            values = list(_gauges.items())
        for (name, tags), value in values:
            try:
                _gauge(name).set(value, tags=dict(tags))
            except Exception as exc:  # noqa: BLE001 - the thread lives on
                _lost(exc)


def answers_stored(stage: str, model: str, rows: pa.Table, usd: float) -> None:
    """Count a block of ledger rows just written (an asker's flush) and what they cost."""
    if not ray.is_initialized() or not rows.num_rows:
        return
    tags = {"stage": stage, "model": model}

    def total(column: str) -> int:
        return int(pc.sum(rows[column]).as_py() or 0)

    def status(value: str) -> int:
        return int(pc.sum(pc.equal(rows["status"], value)).as_py() or 0)

    _inc("cpr_llm_answers", rows.num_rows, tags)
    _inc("cpr_llm_requests", total("calls"), tags)
    _inc("cpr_llm_prompt_tokens", total("prompt_tokens"), tags)
    _inc("cpr_llm_completion_tokens", total("completion_tokens"), tags)
    _inc("cpr_llm_usd", usd, tags)
    _inc("cpr_llm_retries", total("retries"), tags)
    _inc("cpr_llm_invalid", status("invalid"), tags)
    _inc("cpr_llm_failures", status("failed"), tags)


def ask_started(stage: str, model: str, cached: int, todo: int) -> None:
    """An ask of `todo` rows begins, `cached` requests having been served by the cache."""
    if not ray.is_initialized():
        return
    tags = {"stage": stage, "model": model}
    _inc("cpr_llm_cache_hits", cached, tags)
    _set("cpr_llm_rows_todo", todo, tags)
    _set("cpr_llm_rows_done", 0, tags)


def ask_progress(stage: str, model: str, done: int) -> None:
    """`done` rows of the current ask are answered (the driver sees each block arrive)."""
    if ray.is_initialized():
        _set("cpr_llm_rows_done", done, {"stage": stage, "model": model})


_in_flight: dict[tuple[str, str], int] = {}
_in_flight_lock = threading.Lock()


@contextmanager
def in_flight(stage: str, model: str) -> Iterator[None]:
    """One row being asked by this process, for the block's duration."""
    if not ray.is_initialized():
        yield
        return
    key = (stage, model)
    tags = {"stage": stage, "model": model}
    with _in_flight_lock:
        _in_flight[key] = _in_flight.get(key, 0) + 1
        _set("cpr_llm_in_flight", _in_flight[key], tags)
    try:
        yield
    finally:
        with _in_flight_lock:
            _in_flight[key] -= 1
            _set("cpr_llm_in_flight", _in_flight[key], tags)


def stage_published(stage: str, tables: Mapping[str, Mapping[str, Any]]) -> None:
    """Count the rows of the tables a stage publishes (those whose row count it recorded)."""
    if not ray.is_initialized():
        return
    for table, info in tables.items():
        rows = info.get("rows")
        if isinstance(rows, int):
            _inc("cpr_stage_rows", rows, {"stage": stage, "table": table})
