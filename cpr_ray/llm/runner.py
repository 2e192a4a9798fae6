"""Running one LLM step over a table on Ray: many requests in flight, nothing paid twice.

A step (`LLMTask`) turns one input row into one or more structured questions and returns its
output columns. `run_llm_task`:

1. keys every row by (stage, model, prompt versions, answer schema, the row's request inputs);
2. drops rows whose key already has a valid answer in the stage's cache (an anti-join against
   every earlier run), so a rerun or a nightly refresh pays only for new rows;
3. sends the rest through a pool of `LLMActor`s (async, a semaphore of requests in flight each).
   Each actor appends its answers to the cache and every row's cost to the ledger as they
   arrive (small atomic Parquet parts, flushed at least every `FLUSH_S`), so a killed run loses
   at most a second of paid answers and its rerun asks only for what is missing. An actor lost
   with its node is restarted by Ray on a surviving node and given its batches again; it serves
   what the lost actor had flushed and asks only for the rest (`LLMActor._answered_in_this_run`);
4. stops the stage with one clear line when the endpoint refuses us (key, model, URL), when
   more calls fail or come back invalid than the configured rates allow, or when a build
   stage reaches a spend cap (`spend.Budget`: `llm.max_usd`, `llm.stages.<stage>.max_usd`,
   checked as answers arrive), and otherwise returns every input row with its answer, status
   and reason.

Only `ok` answers are served from the cache. Invalid answers (the model kept breaking the
contract after re-asks) and transport failures are in the ledger, and are asked again next run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import queue
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import ray

from cpr_ray import duck, metrics
from cpr_ray.config import LLMConfig, stage_name
from cpr_ray.errors import ConfigError, InputError, LLMStageError, UserError
from cpr_ray.llm.answers import check_pins
from cpr_ray.llm.client import LLMClient, RateLimiter, Status, Usage, probe_endpoint
from cpr_ray.llm.prompts import Prompt
from cpr_ray.llm.ratelimit import ClusterRateLimiter
from cpr_ray.llm.spend import Budget, cost_usd
from cpr_ray.ray_runtime import user_errors_from_ray
from cpr_ray.stage import StageRun, console
from cpr_ray.storage import Storage, StorageConfig, join

KEY = "request_key"
ACTOR_CPUS = 0.25  # the actors wait on the network; a quarter CPU each leaves room for the rest
FLUSH_S = 0.5  # an answer reaches storage at most this long after it arrives
FLUSH_ROWS = 256  # or as soon as this many are pending
CALLS_PER_ACTOR = 4  # batches (each 2 × max_in_flight rows) an actor works on at once

LEDGER = pa.schema(
    [
        (KEY, pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("model", pa.string()),
        ("prompt_version", pa.string()),
        ("calls", pa.int32()),
        ("retries", pa.int32()),
        ("reasks", pa.int32()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("latency_s", pa.float64()),
    ]
)


# what every answered row carries beside the task's own columns
ANSWER_COLUMNS = (
    KEY,
    "status",
    "error",
    "model",
    "prompt_version",
    "prompt_tokens",
    "completion_tokens",
)


def without_answer_columns(table: pa.Table) -> pa.Table:
    """A stage's output ready to be the next stage's input (its own answer columns dropped)."""
    return table.drop_columns([c for c in ANSWER_COLUMNS if c in table.column_names])


class LLMTask(ABC):
    """One LLM step: which inputs define a request, what it asks, what columns it returns.

    `output_schema` holds what the model answered (that is what the cache keeps); `derive` turns
    answers into decisions after every cache read, so a changed rule applies to old answers
    without re-asking and can never be served stale from the cache.
    """

    stage: str
    prompts: tuple[Prompt, ...]
    key_columns: tuple[str, ...]
    output_schema: pa.Schema

    @property
    def input_columns(self) -> tuple[str, ...]:
        """Columns `run` reads from a row: checked before any call."""
        return self.key_columns

    def derive(self, table: pa.Table) -> pa.Table:
        """Decision columns computed from the answer columns (none by default)."""
        return table

    @abstractmethod
    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        """Ask, check, decide: (output columns, status, reason when not ok)."""

    @property
    def prompt_version(self) -> str:
        return "+".join(p.id for p in self.prompts)

    def empty_output(self) -> dict[str, Any]:
        return {f.name: None for f in self.output_schema}

    @property
    def schema_version(self) -> str:
        """A fingerprint of the answer's shape: an answer of another shape is another question."""
        return hashlib.sha256(str(self.output_schema).encode()).hexdigest()[:12]

    def request_key(
        self, model: str, row: dict[str, Any], pin: Mapping[str, Any] | None = None
    ) -> str:
        payload = {
            "stage": self.stage,
            "model": model,
            "prompts": self.prompt_version,
            "schema": self.schema_version,
            "inputs": {c: row.get(c) for c in self.key_columns},
        }
        if pin:  # a pinned answer is another question (absent otherwise: keys stay as they were)
            payload["pin"] = dict(pin)
        blob = json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class AnswerSink:
    """Where an actor appends answers as they arrive (picklable: it travels to the actors)."""

    storage: StorageConfig
    cache: str
    ledger: str
    tag: str  # unique per call of run_llm_task


class LLMActor:
    """Ray Data actor: one async client, up to `max_in_flight` requests at a time."""

    def __init__(
        self,
        task: LLMTask,
        llm: LLMConfig,
        base_url: str,
        limiter: RateLimiter | None,
        sink: AnswerSink,
    ) -> None:
        self.task, self.llm, self.sink = task, llm, sink
        self.client = LLMClient(llm, base_url=base_url, limiter=limiter)
        self.model = llm.for_stage(task.stage)[0]
        self.storage = Storage(sink.storage)
        self.schema = result_schema(task)
        self.uid = uuid.uuid4().hex[:8]
        self.parts = 0
        self.pending: list[dict[str, Any]] = []
        # one semaphore per actor, made on its event loop: Ray runs several batches of an async
        # actor at once, and the in-flight limit is the actor's, not the batch's
        self._sem: asyncio.Semaphore | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._refused: UserError | None = None

    async def _one(self, sem: asyncio.Semaphore, row: dict[str, Any]) -> dict[str, Any]:
        async with sem:
            if self._refused is not None:  # another batch of this actor was refused: send no more
                raise self._refused
            usage = Usage()
            started = time.perf_counter()
            try:
                with metrics.in_flight(self.task.stage, self.model):
                    out, status, error = await self.task.run(self.client, row, usage)
            except UserError as exc:
                self._refused = exc  # the endpoint refuses us as configured: stop the stage
                raise
            except Exception as exc:  # a bug or surprise in one row must not fail the batch
                out, status = self.task.empty_output(), "failed"
                error = f"{type(exc).__name__}: {exc}"[:500]
            result = {
                **out,
                KEY: row[KEY],
                "status": status,
                "error": error,
                "model": self.model,
                "prompt_version": self.task.prompt_version,
                "calls": usage.calls,
                "retries": usage.retries,
                "reasks": usage.reasks,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "latency_s": time.perf_counter() - started,
            }
            self.pending.append(result)
            if len(self.pending) >= FLUSH_ROWS:
                self.flush()
            return result

    def flush(self) -> None:
        """Append what arrived since the last flush: valid answers to the cache, all to the
        ledger."""
        if not self.pending:
            return
        rows, self.pending = self.pending, []
        table = pa.Table.from_pylist(rows, schema=self.schema)
        name = f"{self.sink.tag}-{self.uid}-{self.parts:05d}.parquet"
        self.parts += 1
        ok = table.filter(pc.equal(table["status"], "ok"))
        if ok.num_rows:
            self.storage.write_parquet(ok, join(self.sink.cache, name))
        self.storage.write_parquet(table.select(LEDGER.names), join(self.sink.ledger, name))
        metrics.answers_stored(self.task.stage, self.model, table, self.llm)

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()

    async def __call__(self, batch: pa.Table) -> pa.Table:
        recovered = self.schema.empty_table()
        if ray.get_runtime_context().was_current_actor_reconstructed:
            recovered = self._answered_in_this_run(batch[KEY])
            batch = batch.filter(pc.invert(pc.is_in(batch[KEY], value_set=recovered[KEY])))
        return pa.concat_tables([recovered, await self.answer(batch)])

    async def answer(self, batch: pa.Table) -> pa.Table:
        """Every row of `batch` asked, at most `max_in_flight` of this asker's at once."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.llm.max_in_flight)
            self._flusher = asyncio.get_running_loop().create_task(self._flush_every())
        sem = self._sem
        tasks = [asyncio.ensure_future(self._one(sem, r)) for r in batch.to_pylist()]
        try:
            rows = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:  # a refusal stops the batch's other requests too, not just one row
                t.cancel()
            raise
        finally:
            self.flush()  # what was answered is kept even when the batch stops on a refusal
        return pa.Table.from_pylist(rows, schema=self.schema)

    async def close(self) -> None:
        """Stop the periodic flush and close the connections (an asker used outside Ray)."""
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        self.flush()
        await self.client.aclose()

    def _answered_in_this_run(self, keys: pa.Array) -> pa.Table:
        """The answers this run's actors already flushed for `keys`, as they were cached.

        Only a restarted actor asks: its node was lost with a batch in hand, and Ray retries
        that batch here. The lost actor's answers reached the cache as they arrived (at most
        `FLUSH_S` behind), and they were paid for: they are served, not asked again, and keep
        their single ledger row. Reading this run's parts only keeps it cheap."""
        parts = [
            f.path
            for f in self.storage.list_files(self.sink.cache, (".parquet",), missing_ok=True)
            if f.base_name.startswith(f"{self.sink.tag}-")
        ]
        if not parts:
            return self.schema.empty_table()
        loc = self.storage.resolve(self.sink.cache)
        found = pds.dataset(parts, filesystem=loc.fs, format="parquet", schema=self.schema)
        return _first_per_key(found.to_table(filter=pc.field(KEY).isin(keys)))

    def __del__(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        with suppress(Exception):
            self.flush()


def result_schema(task: LLMTask) -> pa.Schema:
    return pa.schema(list(task.output_schema) + list(LEDGER))


@dataclass
class TaskRun:
    """All input rows with answers, and what it cost."""

    table: pa.Table
    stats: dict[str, Any]

    @property
    def complete(self) -> bool:
        """False when some rows failed in transport: the output must not be reused as final."""
        return not self.stats.get("new_failed")


def _read_cache(storage: Storage, uri: str, keys: pa.Array, schema: pa.Schema) -> pa.Table:
    loc = storage.resolve(uri)
    if not storage.exists(uri):
        return schema.empty_table()
    ds = pds.dataset(loc.path, filesystem=loc.fs, format="parquet", schema=schema)
    # parts written before only valid answers were cached may hold invalid ones: never serve them
    return ds.to_table(filter=pc.field(KEY).isin(keys) & (pc.field("status") == "ok"))


def cache_uri(storage: Storage, stage: str) -> str:
    return join(storage.root, "_llm", "cache", stage)


def ledger_uri(storage: Storage, stage: str) -> str:
    """A stage's ledger (and, beside it, its cache): parts named by run, call and actor, each
    written once and never rewritten, so any number of runs append at once and a read merges
    the parts; no file here has two writers."""
    return join(storage.root, "_llm", "ledger", stage)


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
    keys = [
        task.request_key(model, r, pin) for r in inputs.select(list(task.key_columns)).to_pylist()
    ]
    inputs = inputs.append_column(KEY, pa.array(keys, pa.string()))
    schema = result_schema(task)
    cache = cache_uri(storage, task.stage)
    unique_keys = pc.unique(inputs[KEY])
    cached = _read_cache(storage, cache, unique_keys, schema)
    todo = inputs.filter(pc.invert(pc.is_in(inputs[KEY], value_set=cached[KEY])))
    todo = _first_per_key(todo)  # identical requests within this run are asked once
    inline = todo.num_rows <= cfg.inline_max_rows
    console.print(
        f"  {task.stage}: {inputs.num_rows:,} rows, {cached.num_rows:,} already answered "
        f"(cache), {todo.num_rows:,} to ask {model} at {base_url}"
        + ("" if not todo.num_rows else " from this process" if inline else "")
    )
    metrics.ask_started(task.stage, model, len(unique_keys) - todo.num_rows, todo.num_rows)

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
    sink = AnswerSink(
        storage.cfg, cache, ledger_uri(storage, task.stage), f"{run.run_id}-{call_id}"
    )
    answered: list[pa.Table] = [cached]
    counts = {"ok": 0, "invalid": 0, "failed": 0}
    tokens = {"prompt": 0, "completion": 0}
    spent = 0.0  # USD of this ask's new answers
    ledgers: list[pa.Table] = []
    recent: list[pa.Table] = []  # answers since the last report: the sample a stop quotes
    reported = 0
    asking = ask_inline if inline else ask_pool
    with asking(task, cfg, todo, base_url=base_url, limiter=limiter, sink=sink) as answers:
        for out in answers:
            ledgers.append(out.select(LEDGER.names))
            answered.append(out)
            recent.append(out)
            for status in counts:
                counts[status] += pc.sum(pc.equal(out["status"], status)).as_py() or 0
            tokens["prompt"] += pc.sum(out["prompt_tokens"]).as_py() or 0
            tokens["completion"] += pc.sum(out["completion_tokens"]).as_py() or 0
            spent += cost_usd(cfg, out)
            done = sum(counts.values())
            metrics.ask_progress(task.stage, model, done)
            last = done >= todo.num_rows
            if budget is not None and not last:  # the last answers are paid: keep them
                budget.check(spent)
            if done - reported < report_every and not last:
                continue
            reported = done
            console.print(
                f"  {task.stage}: {done:,}/{todo.num_rows:,} asked — ok {counts['ok']:,}, "
                f"invalid {counts['invalid']:,}, failed {counts['failed']:,}; tokens "
                f"{tokens['prompt']:,} in / {tokens['completion']:,} out; "
                + (budget.progress(spent) if budget else f"${spent:,.2f}")
            )
            if last or done >= cfg.min_calls_for_failure_rate:  # early when many calls say so
                sample = pa.concat_tables(recent)
                _check_rates(
                    task.stage, cfg, counts, sample, base_url, ledger_uri(storage, task.stage)
                )
            recent = []

    results = pa.concat_tables(answered).select([*task.output_schema.names, *ANSWER_COLUMNS])
    results = _first_per_key(results)
    table = task.derive(_join_results(inputs, results))
    ledger_all = pa.concat_tables(ledgers) if ledgers else LEDGER.empty_table()
    stats = {
        "rows": inputs.num_rows,
        "cached": int(pc.sum(pc.is_in(inputs[KEY], value_set=cached[KEY])).as_py() or 0),
        "asked": todo.num_rows,
        **{f"new_{k}": v for k, v in counts.items()},
        "calls": int(pc.sum(ledger_all["calls"]).as_py() or 0),
        "prompt_tokens": tokens["prompt"],
        "completion_tokens": tokens["completion"],
        "cost_usd": cost_usd(cfg, ledger_all),
        "model": model,
        "prompt_version": task.prompt_version,
    }
    return TaskRun(table, stats)


@contextmanager
def ask_inline(
    task: LLMTask,
    cfg: LLMConfig,
    rows: pa.Table,
    *,
    base_url: str,
    limiter: RateLimiter | None,
    sink: AnswerSink,
) -> Iterator[Iterator[pa.Table]]:
    """`ask_pool`'s answers for a small ask (`llm.inline_max_rows`), asked by this process.

    The asker is an `LLMActor` used as a plain object, with the pool's whole in-flight limit
    (actors × max_in_flight), so the cache, ledger, flushing and refusal rules are the pool's
    own. It runs on an event loop of its own thread, one wave of requests per block, and the
    blocks come back as they complete, so the caller reports progress and applies its rate
    checks as with a pool, and an async caller (a Serve replica) is served too. Leaving the
    block early (a stop, Ctrl-C) cancels the requests in flight and keeps what was answered.
    What Ray adds to an actor, a restart on another node, has nothing to restart here: the
    driver is the run, and a killed driver's rerun is served what was flushed."""
    wave = cfg.actors * cfg.max_in_flight
    blocks = [rows.slice(i, wave) for i in range(0, rows.num_rows, wave)]
    if not blocks:
        yield iter(())
        return
    asker = LLMActor(task, cfg.model_copy(update={"max_in_flight": wave}), base_url, limiter, sink)
    answered: queue.Queue[pa.Table | BaseException] = queue.Queue()

    tasks: list[asyncio.Future[pa.Table]] = []
    left = False  # set on the loop when the caller leaves (before or after the asking starts)

    async def drive() -> None:
        tasks.extend(asyncio.ensure_future(asker.answer(b)) for b in blocks)
        if left:
            leave()
        try:
            for next_done in asyncio.as_completed(tasks):
                answered.put(await next_done)
        except BaseException as exc:  # a refusal, or the caller left: it is told either way
            answered.put(exc)
            raise
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asker.close()  # what was answered reaches the cache before the thread ends

    def leave() -> None:
        nonlocal left
        left = True
        for t in tasks:
            t.cancel()

    loop = asyncio.new_event_loop()

    def serve() -> None:
        with suppress(BaseException):  # its outcome went through `answered`
            loop.run_until_complete(drive())
        loop.close()

    thread = threading.Thread(target=serve, name="cpr-llm-inline", daemon=True)
    thread.start()

    def stream() -> Iterator[pa.Table]:
        for _ in blocks:
            while True:
                try:
                    item = answered.get(timeout=1.0)
                    break
                except queue.Empty:
                    if not thread.is_alive():
                        raise RuntimeError(f"{task.stage}: the asking thread ended early") from None
            if isinstance(item, BaseException):
                raise item
            yield item

    try:
        yield stream()
    finally:
        with suppress(RuntimeError):  # its loop is closed once it is done
            loop.call_soon_threadsafe(leave)
        thread.join()


@contextmanager
def ask_pool(
    task: LLMTask,
    cfg: LLMConfig,
    rows: pa.Table,
    *,
    base_url: str,
    limiter: RateLimiter | None,
    sink: AnswerSink,
) -> Iterator[Iterator[pa.Table]]:
    """Every row of `rows` through one pool of LLM actors, answered blocks as they complete.

    One pool serves the whole table: starting actors costs seconds, which per chunk of a few
    hundred rows would be most of a stage's time. Leaving the block early (a rate check or a
    spend cap that stops the stage) shuts the pool down at once, cancelling what its actors
    have in flight; a refusal by the endpoint surfaces as its one line.
    """
    schema = result_schema(task)
    actors = max(1, min(cfg.actors, rows.num_rows))
    batch = max(1, min(cfg.max_in_flight * 2, -(-rows.num_rows // cfg.actors)))
    # one block per batch: a single block would go to one actor and leave the others idle
    blocks = [rows.slice(i, batch) for i in range(0, rows.num_rows, batch)]
    if not blocks:
        yield iter(())
        return
    with user_errors_from_ray():
        # Ray Data's defaults restart a lost actor and retry its batches there (max_restarts
        # and max_task_retries -1): a lost spot node costs the stage no rerun
        ds = ray.data.from_arrow(blocks).map_batches(
            LLMActor,
            fn_constructor_kwargs={
                "task": task,
                "llm": cfg,
                "base_url": base_url,
                "limiter": limiter,
                "sink": sink,
            },
            # several batches at once per actor, so its semaphore stays full across batch ends
            compute=ray.data.ActorPoolStrategy(
                size=actors, max_concurrent_calls_per_actor=CALLS_PER_ACTOR
            ),
            batch_size=batch,
            batch_format="pyarrow",
            num_cpus=ACTOR_CPUS,
        )
        stream = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0))
        try:
            yield (t.cast(schema) for t in stream if t.num_rows)
        finally:
            # a stop (a spend cap, a rate check) shuts the pool down now, not when the stream
            # is collected: its actors would go on asking (and paying for) the rest
            stream.close()


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


def _first_per_key(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return table
    idx = pa.array(range(table.num_rows), pa.int64())
    firsts = (
        pa.table({KEY: table[KEY], "_i": idx}).group_by(KEY).aggregate([("_i", "min")])["_i_min"]
    )
    return table.take(pc.take(firsts, pc.sort_indices(firsts)))  # first rows, in table order


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


def ledger_summary(storage: Storage, cfg: LLMConfig | None = None) -> list[dict[str, Any]]:
    """Per LLM stage, over every run: rows asked, HTTP calls, outcomes, tokens, cost."""
    out = []
    root = join(storage.root, "_llm", "ledger")
    for stage_dir in storage.list_dirs(root):
        loc = storage.resolve(stage_dir)
        t = pds.dataset(loc.path, filesystem=loc.fs, format="parquet", schema=LEDGER).to_table()
        status = t["status"]
        out.append(
            {
                "stage": stage_dir.rsplit("/", 1)[1],
                "rows": t.num_rows,
                "calls": int(pc.sum(t["calls"]).as_py() or 0),
                "ok": int(pc.sum(pc.equal(status, "ok")).as_py() or 0),
                "invalid": int(pc.sum(pc.equal(status, "invalid")).as_py() or 0),
                "failed": int(pc.sum(pc.equal(status, "failed")).as_py() or 0),
                "prompt_tokens": int(pc.sum(t["prompt_tokens"]).as_py() or 0),
                "completion_tokens": int(pc.sum(t["completion_tokens"]).as_py() or 0),
                "cost_usd": cost_usd(cfg, t) if cfg is not None else None,
            }
        )
    return out


def write_failures(storage: Storage, table: pa.Table, uri: str) -> int:
    failures = table.filter(pc.not_equal(table["status"], "ok"))
    if failures.num_rows:
        storage.write_parquet(failures, uri)
    return failures.num_rows


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
