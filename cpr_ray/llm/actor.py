"""The asker: one async client with many requests in flight, answers flushed as they arrive."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import suppress
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import ray

from cpr_ray.config import LLMConfig
from cpr_ray.errors import UserError
from cpr_ray.llm.client import LLMClient, RateLimiter, Usage
from cpr_ray.llm.reserve import RowBudget, SpendCapReached
from cpr_ray.llm.spend import cost_usd
from cpr_ray.llm.spend_ledger import LEDGER, AnswerSink, first_per_key, result_schema
from cpr_ray.llm.task import KEY, LLMTask
from cpr_ray.runs import prometheus as metrics
from cpr_ray.storage.store import Storage, join

FLUSH_S = 0.5  # an answer reaches storage at most this long after it arrives
FLUSH_ROWS = 256  # or as soon as this many are pending
UNASKED = "unasked"  # the status of a row the spend cap kept from being asked (never stored)


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
        self._capped = False  # the stage's budget refused a request: ask nothing more
        # who asked, in each ledger row: it settles this asker's reservations of that row
        self.asker = f"{sink.tag}-{self.uid}"

    async def _one(self, sem: asyncio.Semaphore, row: dict[str, Any]) -> dict[str, Any]:
        async with sem:
            if self._refused is not None:  # another batch of this actor was refused: send no more
                raise self._refused
            if self._capped:  # the stage reached its spend cap: the row is not asked
                return self._unasked(row)
            usage = Usage()
            gate = self.sink.gate
            if gate is not None:
                usage.budget = RowBudget(gate, self.asker, row[KEY], self.model)
            started = time.perf_counter()
            try:
                with metrics.in_flight(self.task.stage, self.model):
                    out, status, error = await self.task.run(self.client, row, usage)
            except UserError as exc:
                self._refused = exc  # the endpoint refuses us as configured: stop the stage
                raise
            except SpendCapReached as exc:
                self._capped = True  # this actor's other rows wait for no reservation
                if not usage.calls:
                    return self._unasked(row)
                # asked before the cap, not finished: what its requests cost is in the ledger
                out, status, error = self.task.empty_output(), "failed", str(exc)
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
                "cached_prompt_tokens": usage.cached_prompt_tokens,
                "asker": self.asker,
            }
            self.pending.append(result)
            if len(self.pending) >= FLUSH_ROWS:
                self.flush()
            return result

    def _unasked(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row the spend cap kept from being asked: returned as `unasked`, in no ledger."""
        return {
            **self.task.empty_output(),
            **{name: None for name in LEDGER.names},
            KEY: row[KEY],
            "status": UNASKED,
            "model": self.model,
        }

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
        usd = cost_usd(self.llm, table)
        metrics.answers_stored(self.task.stage, self.model, table, usd)

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
        return first_per_key(found.to_table(filter=pc.field(KEY).isin(keys)))

    def __del__(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        with suppress(Exception):
            self.flush()
