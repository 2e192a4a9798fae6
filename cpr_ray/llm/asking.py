"""The two ways a step's rows are asked: from this process (a small ask) or through a pool of
actors. Both yield answered blocks as they complete, so the runner reports and checks alike."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pyarrow as pa
import ray

from cpr_ray.config import LLMConfig
from cpr_ray.llm.actor import LLMActor
from cpr_ray.llm.client import RateLimiter
from cpr_ray.llm.spend_ledger import AnswerSink, result_schema
from cpr_ray.llm.task import LLMTask
from cpr_ray.runs.ray_runtime import user_errors_from_ray

ACTOR_CPUS = 0.25  # the actors wait on the network; a quarter CPU each leaves room for the rest
CALLS_PER_ACTOR = 4  # batches (each 2 × max_in_flight rows) an actor works on at once


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
        # Any: iter_batches gives a generator (closed below) of pa.Tables for "pyarrow", which
        # Ray types as an Iterator of every batch format
        stream: Any = iter(
            ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0)
        )
        try:
            yield (t.cast(schema) for t in stream if t.num_rows)
        finally:
            # a stop (a spend cap, a rate check) shuts the pool down now, not when the stream
            # is collected: its actors would go on asking (and paying for) the rest
            stream.close()
