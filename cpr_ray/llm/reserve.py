"""Reservations: a spend cap that no number of requests in flight can pass.

Every request of a capped stage reserves its worst case (`spend.worst_usd`: its prompt's token
bound at the input price, `max_tokens` at the output price) before it is sent, from one
`Reserver` every asker of the stage consults: the driver's own asker directly, a pool's actors
through one small Ray actor (`shared_reserver`). When the answer arrives the reservation is
settled at what the reply's tokens cost. So spent + reserved <= the room the caps leave, at every
instant. A request that does not fit waits while others are in flight (their settling may free
room); one that does not fit with nothing else in flight, or that waited longer than a request
can take (its room held by an asker that died), stops the stage: the Reserver refuses every
request from then on, and the askers send nothing more.

On a fleet priced by the node-hour (`llm.fleet`) the room also shrinks as the stage's clock runs:
a request fits only if spent + reserved + the node-hours accrued since the stage's first request
+ its worst case fit the room (the driver charges the same node-hours to the ledger from the
`started` the Reserver reports: it runs on the driver's node, on the same clock). Node-hours
accrue whatever is asked, so the answers in flight when they fill the room add theirs (within a
block's duration) past the cap; tokens never pass it.

A grant is journaled before it is returned: a row under ``ROOT/_llm/reserved/STAGE/`` naming the
asker and the request, written in a part with whatever else was granted meanwhile. A request
whose asker is killed in flight leaves a reservation no ledger row settles, which the next run's
cap counts at its worst case (`spend.in_doubt`): paid or not, it is never uncounted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import ray

from cpr_ray.llm.spend import RESERVED
from cpr_ray.runs.ray_runtime import on_this_node
from cpr_ray.storage.store import Storage, StorageConfig, join

GATHER_S = 0.02  # a journal write waits this long for other grants to share its part


class SpendCapReached(Exception):
    """The stage's budget refused a request: it was not sent."""


class Gate(Protocol):
    """What an asker consults before each request (a `Reserver`, or its Ray actor's handle)."""

    async def reserve(self, asker: str, key: str, model: str, usd: float) -> bool: ...

    async def settle(self, reserved: float, spent: float) -> None: ...


@dataclass(frozen=True)
class RowBudget:
    """One row's view of the gate: which asker and request a reservation is for."""

    gate: Gate
    asker: str
    key: str
    model: str

    async def reserve(self, usd: float) -> None:
        """Reserve `usd` for the next request of this row, or raise `SpendCapReached`."""
        if not await self.gate.reserve(self.asker, self.key, self.model, usd):
            raise SpendCapReached("the stage reached its spend cap")

    async def settle(self, reserved: float, spent: float) -> None:
        await self.gate.settle(reserved, spent)


class Reserver:
    """The room a stage's caps leave, what is reserved of it, and the journal of grants."""

    def __init__(
        self,
        room_usd: float,
        storage: StorageConfig,
        journal: str,
        tag: str,
        wait_s: float,
        fleet_usd_per_s: float = 0.0,
    ) -> None:
        self.room, self.wait_s = room_usd, wait_s
        # the fleet's node-hours count from the first request (`time.monotonic`, this node's)
        self.fleet_usd_per_s = fleet_usd_per_s
        self.started_at: float | None = None
        self.spent = 0.0  # settled by this ask: what the answers cost
        self.reserved = 0.0  # granted and not yet settled
        self.stopped = False
        self._storage = Storage(storage)
        self._journal, self._tag, self._parts = journal, tag, 0
        self._pending: list[dict[str, Any]] = []
        self._written: asyncio.Future[None] | None = None
        self._changed: asyncio.Condition | None = None  # made on the loop that first uses it

    async def reserve(self, asker: str, key: str, model: str, usd: float) -> bool:
        """Grant `usd` once it fits and is journaled; False when the stage must stop."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        if self.started_at is None:
            self.started_at = time.monotonic()
        deadline = time.monotonic() + self.wait_s
        async with self._changed:
            while not self.stopped and self.spent + self.reserved + self.fleet() + usd > self.room:
                left = deadline - time.monotonic()
                if self.reserved <= 0 or left <= 0:
                    self.stopped = True  # no settling can make room: the cap is reached
                    self._changed.notify_all()
                    break
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    pass  # looked at again: past the deadline it stops
            if self.stopped:
                return False
            self.reserved += usd
        try:
            await self._journaled({"asker": asker, "request_key": key, "model": model, "usd": usd})
        except BaseException:
            await self.settle(usd, 0.0)  # not journaled: not sent
            raise
        return True

    async def settle(self, reserved: float, spent: float) -> None:
        """A request's answer (or its failure, `spent` 0) arrived: its reservation is freed."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            self.reserved = max(0.0, self.reserved - reserved)
            self.spent += spent
            self._changed.notify_all()

    def fleet(self) -> float:
        """USD of the fleet's node-hours since the first request (0 on an unpriced endpoint)."""
        if self.started_at is None:
            return 0.0
        return max(0.0, time.monotonic() - self.started_at) * self.fleet_usd_per_s

    def started(self) -> float | None:
        """When the first request was granted (`time.monotonic`), or None."""
        return self.started_at

    def state(self) -> dict[str, Any]:
        return {
            "spent": self.spent,
            "reserved": self.reserved,
            "fleet": self.fleet(),
            "started": self.started_at,
            "stopped": self.stopped,
        }

    def close(self) -> None:
        """Nothing to end: it lives in this process (the pool's actor is killed instead)."""

    async def _journaled(self, row: dict[str, Any]) -> None:
        """Return once `row` is in a journal part (group commit: one part per write)."""
        self._pending.append(row)
        if self._written is None:
            self._written = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().create_task(self._write(self._written))
        await asyncio.shield(self._written)

    async def _write(self, written: asyncio.Future[None]) -> None:
        await asyncio.sleep(GATHER_S)
        rows, self._pending, self._written = self._pending, [], None
        name = f"{self._tag}-{self._parts:06d}.parquet"
        self._parts += 1
        table = pa.Table.from_pylist(rows, schema=RESERVED)
        try:
            await asyncio.to_thread(self._storage.write_parquet, table, join(self._journal, name))
        except BaseException as exc:
            written.set_exception(exc)
        else:
            written.set_result(None)


@ray.remote(num_cpus=0, max_restarts=0)
class _ReserverActor(Reserver):
    """The pool's one Reserver, on the driver's node (its actors consult it over Ray)."""


class SharedReserver:
    """A pool actor's handle on the stage's `_ReserverActor` (picklable)."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    async def reserve(self, asker: str, key: str, model: str, usd: float) -> bool:
        return await self._actor.reserve.remote(asker, key, model, usd)

    async def settle(self, reserved: float, spent: float) -> None:
        await self._actor.settle.remote(reserved, spent)

    def started(self) -> float | None:
        return self.state()["started"]

    def state(self) -> dict[str, Any]:
        return ray.get(self._actor.state.remote())

    def close(self) -> None:
        ray.kill(self._actor)


def reserver(
    room_usd: float,
    storage: StorageConfig,
    journal: str,
    tag: str,
    wait_s: float,
    *,
    shared: bool,
    fleet_usd_per_s: float = 0.0,
) -> Reserver | SharedReserver:
    """The stage's Reserver: in this process for the driver's own asker, a Ray actor on the
    driver's node for a pool's (`shared`), so `time.monotonic` is one clock for both."""
    tag = f"{tag}-{uuid.uuid4().hex[:6]}"
    args = (room_usd, storage, journal, tag, wait_s, fleet_usd_per_s)
    if not shared:
        return Reserver(*args)
    # mypy does not apply class decorators: ray.remote made _ReserverActor an ActorClass
    actor = _ReserverActor.options(  # type: ignore[attr-defined]
        scheduling_strategy=on_this_node()
    ).remote(*args)
    return SharedReserver(actor)
