"""Running one LLM step over a table on Ray: many requests in flight, none paid twice unless a
kill cut it off.

A step (`LLMTask`) turns one input row into one or more structured questions and returns its
output columns. `run_llm_task`:

1. keys every row by (stage, model, prompt versions, answer schema, the row's request inputs),
   except in a build stage where `refresh.incremental` lets it carry what the stage's last run
   answered: a row whose request inputs equal one of those takes that run's key and answer
   without being keyed or looked up (`carry`), so a refresh keys only the rows its diff reached;
2. drops rows whose key already has a valid answer in the stage's cache (an anti-join against
   every earlier run), so a rerun or a nightly refresh pays only for new rows;
3. sends the rest, rows whose prompts open alike one after another (`LLMTask.prefix_columns`),
   through a pool of `LLMActor`s (async, a semaphore of requests in flight each).
   Each actor appends its answers to the cache and every row's cost to the ledger as they
   arrive (small atomic Parquet parts, flushed at least every `FLUSH_S`), so a killed run loses
   at most a second of paid answers and its rerun asks only for what is missing. Before a build
   stage's request leaves, it reserves its worst case from the stage's `Reserver` (`reserve`),
   which journals it: a request in flight when its process was killed may be paid and is asked
   again by the rerun, so after a kill at most the requests then in flight are paid twice, and
   each is in the journal as a reservation no ledger row settled (`spend.in_doubt`). An actor lost
   with its node is restarted by Ray on a surviving node and given its batches again; it serves
   what the lost actor had flushed and asks only for the rest (`LLMActor._answered_in_this_run`);
4. stops the stage with one clear line when the endpoint refuses us (key, model, URL), when
   more calls fail or come back invalid than the configured rates allow, or when a build
   stage reaches a spend cap (`spend.Budget`: `llm.max_usd`, `llm.stages.<stage>.max_usd`;
   a request that does not fit under it is not sent; on a fleet priced by the node-hour,
   `llm.fleet`, the stage is charged its node-hours at every block, `spend.FleetMeter`, and they
   fill the room too), and otherwise returns every input row with its answer, status and
   reason.

Only `ok` answers are served from the cache. Invalid answers (the model kept breaking the
contract after re-asks) and transport failures are in the ledger, and are asked again next run.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import LLMConfig, stage_name
from cpr_ray.errors import ConfigError, InputError, LLMStageError
from cpr_ray.llm import carry as carried
from cpr_ray.llm.actor import UNASKED
from cpr_ray.llm.answers import check_pins
from cpr_ray.llm.asking import ask_inline, ask_pool
from cpr_ray.llm.client import probe_endpoint
from cpr_ray.llm.ratelimit import ClusterRateLimiter
from cpr_ray.llm.reserve import Reserver, SharedReserver, reserver
from cpr_ray.llm.spend import Budget, FleetMeter, cost_usd, fleet_uri, reserved_uri
from cpr_ray.llm.spend_ledger import (
    LEDGER,
    AnswerSink,
    cache_uri,
    first_per_key,
    ledger_uri,
    read_cache,
    result_schema,
)
from cpr_ray.llm.task import ANSWER_COLUMNS, KEY, LLMTask
from cpr_ray.runs import prometheus as metrics
from cpr_ray.runs.stage_runner import StageRun, console
from cpr_ray.storage.store import Storage
from cpr_ray.tables import duckdb_sql as duck


@dataclass
class TaskRun:
    """All input rows with answers, and what it cost."""

    table: pa.Table
    stats: dict[str, Any]

    @property
    def complete(self) -> bool:
        """False when some rows failed in transport: the output must not be reused as final."""
        return not self.stats.get("new_failed")


@dataclass(frozen=True)
class LLMContext:
    """Where an LLM step outside a build stage (e.g. an evaluation) keeps its cache and ledger."""

    llm: LLMConfig
    storage: Storage
    run_id: str


def run_llm_task(
    run: StageRun | LLMContext, task: LLMTask, inputs: pa.Table, *, base_url: str
) -> TaskRun:
    """Answer `task` for every row of `inputs` (see the module docstring)."""
    cfg, storage = run.llm, run.storage
    missing = [c for c in task.input_columns if c not in inputs.column_names]
    if missing:
        raise InputError(
            f"{task.stage}: its input lacks column(s) {', '.join(missing)} "
            f"(has: {', '.join(inputs.column_names)})"
        )
    check_pins(cfg, [stage_name(task.stage)])
    model = cfg.for_stage(task.stage)[0]
    pin = cfg.pin_for(task.stage)
    schema = result_schema(task)
    answer_schema = pa.schema(
        [schema.field(c) for c in (*task.output_schema.names, *ANSWER_COLUMNS)]
    )
    carry = (
        carried.previous(run, task, model, pin, inputs.schema)
        if isinstance(run, StageRun)
        else None
    )
    memo = carry.memo if carry is not None else None
    inputs = inputs.append_column(KEY, _keys(task, model, pin, inputs, memo))
    known = answer_schema.empty_table()  # the last run's answers for the rows it keyed alike
    if memo is not None:
        known = memo.filter(pc.is_in(memo[KEY], value_set=inputs[KEY]))
        known = known.select(answer_schema.names).cast(answer_schema)
    cache = cache_uri(storage, task.stage)
    unknown = pc.unique(pc.filter(inputs[KEY], pc.invert(pc.is_in(inputs[KEY], known[KEY]))))
    cached = read_cache(storage, cache, unknown, schema) if len(unknown) else schema.empty_table()
    answered_keys = pa.concat_arrays([known[KEY].combine_chunks(), cached[KEY].combine_chunks()])
    todo = inputs.filter(pc.invert(pc.is_in(inputs[KEY], value_set=answered_keys)))
    todo = first_per_key(todo)  # identical requests within this run are asked once
    todo = task.in_ask_order(todo)  # rows opening their prompts alike, asked together
    inline = todo.num_rows <= cfg.inline_max_rows
    console.print(
        f"  {task.stage}: {inputs.num_rows:,} rows, "
        + (f"{known.num_rows:,} carried from the last run, " if memo is not None else "")
        + f"{cached.num_rows:,} already answered (cache), {todo.num_rows:,} to ask {model} at "
        f"{base_url}"
        + ("" if not todo.num_rows else " from this process" if inline else "")
        + (f"; {carry.note}" if carry is not None and memo is None else "")
    )
    metrics.ask_started(
        task.stage, model, len(pc.unique(inputs[KEY])) - todo.num_rows, todo.num_rows
    )

    if isinstance(run, StageRun) and run.progress is not None and todo.num_rows:
        run.progress.step(task.stage, 0, todo.num_rows)
    # the spend caps of a build stage (evaluation's and search's LLM steps are not capped)
    budget = Budget.open(cfg, storage, task.stage) if isinstance(run, StageRun) else None
    if todo.num_rows:
        if budget is not None:
            budget.check(0.0)  # a cap already reached: not one request more
        probe_endpoint(cfg, base_url)  # a dead endpoint or a refused key: one line, right now
    limiter = None
    if cfg.requests_per_second or cfg.tokens_per_minute:
        limiter = ClusterRateLimiter(cfg.requests_per_second, cfg.tokens_per_minute).start()
    report_every = max(cfg.actors * cfg.max_in_flight * 8, 64)
    call_id = uuid.uuid4().hex[:8]  # one run may call several times (tournament rounds)
    tag = f"{run.run_id}-{call_id}"
    gate = meter = None
    if isinstance(run, StageRun) and todo.num_rows:  # a build stage's every request journaled
        journal = reserved_uri(storage, task.stage)
        room = budget.room() if budget is not None else math.inf
        if cfg.fleet.node_hour_usd:  # a priced fleet: its node-hours from now on
            meter = FleetMeter(cfg.fleet, storage, fleet_uri(storage, task.stage), tag)
            run.part_folders.add(meter.folder)
        # a reservation is held for one HTTP request at most: one held longer is a dead asker's
        gate = reserver(
            room,
            storage.cfg,
            journal,
            tag,
            cfg.timeout_s + 30.0,
            shared=not inline,
            fleet_usd_per_s=cfg.fleet.usd_per_s,
        )
        run.part_folders.add(journal)
    sink = AnswerSink(storage.cfg, cache, ledger_uri(storage, task.stage), tag, gate)
    if isinstance(run, StageRun):  # compacted by the stage before it publishes
        run.part_folders.update((sink.cache, sink.ledger))
    answered: list[pa.Table] = [cached]
    counts = {"ok": 0, "invalid": 0, "failed": 0}
    tokens = {"prompt": 0, "completion": 0, "cached": 0}
    spent = 0.0  # USD of this ask's new answers
    # USD of the fleet's node-hours from the ask's start to its latest answers, charged at every
    # block that brings some (blocks of rows left unasked at a cap are not the fleet's work)
    fleet = 0.0
    ledgers: list[pa.Table] = []
    recent: list[pa.Table] = []  # answers since the last report: the sample a stop quotes
    reported = 0
    capped = False  # the budget refused a request: the rest come back unasked
    asking = ask_inline if inline else ask_pool
    with (
        _closing(gate),
        asking(task, cfg, todo, base_url=base_url, limiter=limiter, sink=sink) as answers,
    ):
        for out in _charged(answers, meter, gate):
            asked = pc.not_equal(out["status"], UNASKED)
            if meter is not None and gate is not None and pc.any(asked).as_py():
                fleet = meter.charge(gate.started())  # node-hours up to this block's answers
            if not pc.all(asked).as_py():
                capped, out = True, out.filter(asked)
            ledgers.append(out.select(LEDGER.names))
            answered.append(out)
            recent.append(out)
            for status in counts:
                counts[status] += pc.sum(pc.equal(out["status"], status)).as_py() or 0
            tokens["prompt"] += pc.sum(out["prompt_tokens"]).as_py() or 0
            tokens["completion"] += pc.sum(out["completion_tokens"]).as_py() or 0
            tokens["cached"] += pc.sum(out["cached_prompt_tokens"]).as_py() or 0
            spent += cost_usd(cfg, out)
            done = sum(counts.values())
            metrics.ask_progress(task.stage, model, done)
            last = done >= todo.num_rows
            if isinstance(run, StageRun) and run.progress is not None:
                run.progress.step(task.stage, done, todo.num_rows, spent + fleet)
            if done - reported < report_every and not last:
                continue
            reported = done
            console.print(
                f"  {task.stage}: {done:,}/{todo.num_rows:,} asked — ok {counts['ok']:,}, "
                f"invalid {counts['invalid']:,}, failed {counts['failed']:,}; tokens "
                f"{tokens['prompt']:,} in{cached_note(tokens, 'cached')} / "
                f"{tokens['completion']:,} out; "
                + (budget.progress(spent + fleet) if budget else f"${spent + fleet:,.2f}")
                + (f" (fleet ${fleet:,.2f})" if meter else "")
            )
            if capped:  # rows unasked are no failures: the stop at the cap says why
                continue
            if last or done >= cfg.min_calls_for_failure_rate:  # early when many calls say so
                sample = pa.concat_tables(recent)
                _check_rates(
                    task.stage, cfg, counts, sample, base_url, ledger_uri(storage, task.stage)
                )
            recent = []

        if budget is not None and gate is not None and (capped or gate.state()["stopped"]):
            fleet = meter.usd if meter else 0.0
            budget.stop(spent + fleet)  # every answer that arrived is stored; nothing published

    results = pa.concat_tables([known, pa.concat_tables(answered).select(answer_schema.names)])
    joined = _join_results(inputs, first_per_key(results))
    if isinstance(run, StageRun):  # what the stage's next run may carry
        carried.remember(storage, run.out, task, tag, joined)
    table = task.derive(joined)
    ledger_all = pa.concat_tables(ledgers) if ledgers else LEDGER.empty_table()
    stats = {
        "rows": inputs.num_rows,
        "cached": int(pc.sum(pc.is_in(inputs[KEY], value_set=answered_keys)).as_py() or 0),
        "carried": int(pc.sum(pc.is_in(inputs[KEY], value_set=known[KEY])).as_py() or 0),
        "keyed": carry.note if carry is not None else "every row keyed",
        "asked": todo.num_rows,
        **{f"new_{k}": v for k, v in counts.items()},
        "calls": int(pc.sum(ledger_all["calls"]).as_py() or 0),
        "prompt_tokens": tokens["prompt"],
        "completion_tokens": tokens["completion"],
        "cached_prompt_tokens": tokens["cached"],
        "cost_usd": cost_usd(cfg, ledger_all),
        "fleet_usd": round(meter.usd, 6) if meter else 0.0,
        "model": model,
        "prompt_version": task.prompt_version,
    }
    return TaskRun(table, stats)


def _keys(
    task: LLMTask,
    model: str,
    pin: dict[str, Any] | None,
    inputs: pa.Table,
    memo: pa.Table | None,
) -> pa.Array:
    """Every input row's request key: rows whose request inputs equal a row of the last run's
    `memo` take its key (`carried.match`); only the others are keyed here, in Python, one at a
    time."""
    if memo is None:
        found = pa.nulls(inputs.num_rows, pa.string())
    else:
        found = carried.match(inputs, memo, task)
    fresh = pc.is_null(found)
    rows = inputs.filter(fresh).select(list(task.key_columns)).to_pylist()
    keys = pa.array([task.request_key(model, r, pin) for r in rows], pa.string())
    return pc.replace_with_mask(found, fresh, keys)


@contextmanager
def _closing(gate: Reserver | SharedReserver | None) -> Iterator[None]:
    """The stage's Reserver for the block, ended with it."""
    try:
        yield
    finally:
        if gate is not None:
            gate.close()


def _charged(
    answers: Iterator[pa.Table], meter: FleetMeter | None, gate: Reserver | SharedReserver | None
) -> Iterator[pa.Table]:
    """The blocks of answers, and once they end (all of them, a stop, an error) the fleet's
    node-hours charged up to then."""
    try:
        yield from answers
    finally:
        if meter is not None and gate is not None:
            meter.charge(gate.started())


def cached_note(stats: dict[str, Any], key: str = "cached_prompt_tokens") -> str:
    """` (N cached)` after a count of prompt tokens when the endpoint reported prompt-cache hits
    (`usage.prompt_tokens_details.cached_tokens`); nothing where it reported none."""
    cached = stats.get(key) or 0
    return f" ({cached:,} cached)" if cached else ""


def _check_rates(
    stage: str,
    cfg: LLMConfig,
    counts: dict[str, int],
    last: pa.Table,
    base_url: str,
    ledger: str,
) -> None:
    """Stop the stage when transport failures or invalid answers pass their limits.

    Failures (the endpoint did not answer) and invalid answers (it answered, against the
    contract) have separate limits, so a placeholder model may break the contract in a dry run
    while a dead or failing endpoint still stops it.
    """
    done = sum(counts.values())
    if not done:
        return
    for status, limit, key in (
        ("failed", cfg.max_failure_rate, "llm.max_failure_rate"),
        ("invalid", cfg.max_invalid_rate, "llm.max_invalid_rate"),
    ):
        if counts[status] / done <= limit:
            continue
        sample = last.filter(pc.equal(last["status"], status))["error"].to_pylist()
        reasons = "; ".join(dict.fromkeys(e for e in sample if e))  # distinct, in order
        raise LLMStageError(
            f"{stage}: {counts[status]:,} of {done:,} calls to {base_url} {status} "
            f"({counts[status] / done:.0%} > {key}={limit:.0%}): {reasons[:600]}. Nothing was "
            f"published; valid answers are kept and a rerun asks only for the rest (per-row "
            f"reasons in {ledger})"
        )


def _join_results(inputs: pa.Table, results: pa.Table) -> pa.Table:
    """Every input row with its answer; a row never answered is a failure with that reason."""
    return duck.query(
        f"""SELECT i.* EXCLUDE (_row), r.* EXCLUDE ({KEY}, status, error),
                  coalesce(r.status, 'failed') AS status,
                  CASE WHEN r.status IS NULL THEN 'no answer was recorded' ELSE r.error END
                      AS error
           FROM (SELECT *, row_number() OVER () AS _row FROM inputs) i
           LEFT JOIN results r USING ({KEY})
           ORDER BY i._row""",
        inputs=inputs,
        results=results,
    )


def endpoint_url(llm: LLMConfig, needed_by: str = "the LLM stages") -> str:
    """The endpoint, or one line saying it must be given: checked before anything starts, by
    the build's stages and by evaluation's and search's LLM steps alike."""
    if not llm.base_url:
        raise ConfigError(
            f"llm.base_url is not set: {needed_by} need llm.base_url to name an "
            "OpenAI-compatible endpoint (--set llm.base_url=http://host:8000/v1, key in "
            "$OPENAI_API_KEY); `cpr dry-run` starts a local one"
        )
    return llm.base_url
