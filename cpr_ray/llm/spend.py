"""What the build's LLM stages have spent, and the caps that stop them.

Spend is the ledgers' tokens at `llm.prices` (`cost_usd`), plus every request *reserved* but
never settled (`in_doubt`): the ledger is written as answers arrive and its rows are never
changed (a compaction moves them into fewer files, and a read counts each once), and before a
request leaves its asker journals a reservation of its worst case under ``ROOT/_llm/reserved/``
(`llm.reserve`). A reservation whose asker wrote a ledger row for its request was settled by
that row; one with no such row belongs to an asker killed with the request in flight: paid or
not, nobody knows, so it counts at its worst case. On a self-hosted fleet priced by the node-hour
(`llm.fleet`), each ask of a build stage is also charged the fleet's node-hours while it asks
(`FleetMeter`), written under ``ROOT/_llm/fleet/`` at every block of answers. Together they are
the one record of what was (or may have been) paid, whichever run or machine paid it. Two caps,
both optional:

- `llm.max_usd`, the build's: every answer the root's ledgers hold, so a resumed build counts
  what its earlier stages and its stopped runs already spent;
- `llm.stages.<stage>.max_usd`, a stage's: every answer of that stage's ledger.

A nightly refresh adds to the same ledgers night after night; it counts only what it spends
itself (`counted_from_here`), so the cap is a night's and the build's spend does not use it up.

`run_llm_task` opens a `Budget` per ask and checks it before the first request; every request
then reserves its worst case from the room the budget leaves (`llm.reserve`), so spent plus
reserved never passes the cap, whatever the number of actors and requests in flight. Node-hours
accrue with time, not requests: the room a request may reserve from shrinks as the fleet's
clock runs, so no request is sent once they fill it, and the charge can pass the cap by at most
the node-hours of the answers then in flight (within one block's duration). At a cap
the askers send nothing more, store the answers still arriving, the stage publishes nothing,
and a rerun with a higher cap is served what was paid from the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import BUILD_LLM_STAGES, LLMConfig, LLMStage, stage_name
from cpr_ray.config.llm import FleetConfig
from cpr_ray.errors import SpendCapError
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables.compaction import read_parts

# the ledger columns a cost needs (a part holds more; reading these is enough)
COST_COLUMNS = pa.schema(
    [
        ("model", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cached_prompt_tokens", pa.int64()),  # null in parts written before it: none cached
    ]
)

# what a reservation journal part holds: one row per request reserved (each HTTP call)
RESERVED = pa.schema(
    [
        ("asker", pa.string()),  # the asker (run, call and actor) that reserved it
        ("request_key", pa.string()),
        ("model", pa.string()),
        ("usd", pa.float64()),  # the request's worst case at llm.prices
    ]
)
# what a fleet charge part holds: one row per block of answers an ask of a stage received
FLEET = pa.schema(
    [
        ("asker", pa.string()),  # the ask (run and call) the fleet served
        ("seconds", pa.float64()),  # since the ask's previous row (its first: since it began)
        ("nodes", pa.int32()),  # llm.fleet.nodes
        ("node_hour_usd", pa.float64()),  # llm.fleet.node_hour_usd
        ("usd", pa.float64()),  # seconds × nodes × node_hour_usd / 3600
    ]
)
# the ledger columns that settle a reservation: a row of the same asker and request
SETTLING = pa.schema([("asker", pa.string()), ("request_key", pa.string())])
# below the cap by a micro-dollar: the ledger's sum is rounded to one (`cost_usd`)
MARGIN_USD = 1e-6

# spend per ledger stage already in the root when a refresh began: not the refresh's own
_BEFORE: ContextVar[dict[str, float] | None] = ContextVar("cpr_spend_before", default=None)


def cost_usd(cfg: LLMConfig, ledger: pa.Table) -> float:
    """USD of a ledger's (or a block of answers') tokens at `llm.prices` (unpriced models: 0).
    Prompt tokens the endpoint served from its cache are paid at the cached price."""
    sums = [("prompt_tokens", "sum"), ("completion_tokens", "sum")]
    if "cached_prompt_tokens" in ledger.schema.names:
        sums.append(("cached_prompt_tokens", "sum"))
    total = 0.0
    for row in ledger.group_by("model").aggregate(sums).to_pylist():
        price = cfg.prices.get(row["model"])
        if price:
            prompt = row["prompt_tokens_sum"] or 0
            cached = min(row.get("cached_prompt_tokens_sum") or 0, prompt)
            total += (prompt - cached) * price.input_per_mtok / 1e6
            total += cached * price.cached_per_mtok / 1e6
            total += (row["completion_tokens_sum"] or 0) * price.output_per_mtok / 1e6
    return round(total, 6)


def call_usd(cfg: LLMConfig, model: str, prompt: int, completion: int, cached: int = 0) -> float:
    """USD of one reply's tokens, as `cost_usd` prices a ledger's."""
    price = cfg.prices.get(model)
    if not price:
        return 0.0
    cached = min(cached, prompt)
    return (
        (prompt - cached) * price.input_per_mtok
        + cached * price.cached_per_mtok
        + completion * price.output_per_mtok
    ) / 1e6


def worst_usd(cfg: LLMConfig, model: str, prompt_bound: int, max_tokens: int) -> float:
    """USD a request can cost at most: its prompt's token bound at the dearer of the input
    prices, and `max_tokens` completed."""
    price = cfg.prices.get(model)
    if not price:
        return 0.0
    per_prompt = max(price.input_per_mtok, price.cached_per_mtok)
    return (prompt_bound * per_prompt + max_tokens * price.output_per_mtok) / 1e6


def reserved_uri(storage: Storage, stage: str) -> str:
    """A stage's reservation journal, beside its ledger: parts named by run, call and part."""
    return join(storage.root, "_llm", "reserved", stage)


def fleet_uri(storage: Storage, stage: str) -> str:
    """A stage's fleet charges, beside its ledger: parts named by run, call and part."""
    return join(storage.root, "_llm", "fleet", stage)


class FleetMeter:
    """One ask's node-hours on a priced fleet (`llm.fleet`), charged as they accrue: from the
    ask's first request (when its Reserver granted one), each `charge` writes a part for the
    seconds since the previous one. The ask charges at every block of answers and when its
    answers end, so a killed driver leaves uncharged at most the seconds since its last block.
    """

    def __init__(
        self,
        fleet: FleetConfig,
        storage: Storage,
        folder: str,
        tag: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet, self.storage, self.folder, self.tag = fleet, storage, folder, tag
        self.clock = clock
        self.charged_until: float | None = None  # the first request's time, then each charge's
        self.usd = 0.0  # charged so far
        self._parts = 0

    def charge(self, started: float | None) -> float:
        """Write the seconds since the last charge (the first: since `started`, the first
        request's time on `clock`; None: none was sent yet, nothing to charge); the ask's USD
        charged so far."""
        if self.charged_until is None:
            if started is None:
                return self.usd
            self.charged_until = started
        now = self.clock()
        seconds, self.charged_until = max(0.0, now - self.charged_until), now
        usd = seconds * self.fleet.usd_per_s
        row = {
            "asker": self.tag,
            "seconds": seconds,
            "nodes": self.fleet.nodes,
            "node_hour_usd": self.fleet.node_hour_usd,
            "usd": usd,
        }
        part = join(self.folder, f"{self.tag}-{self._parts:06d}.parquet")
        self.storage.write_parquet(pa.Table.from_pylist([row], schema=FLEET), part)
        self._parts += 1
        self.usd += usd
        return self.usd


def in_doubt(storage: Storage, stage: str) -> pa.Table:
    """The stage's reservations no ledger row settled: requests whose asker died with them in
    flight (or was stopped by an error no row records), each counted at its worst case."""
    reserved = read_parts(storage, reserved_uri(storage, stage), RESERVED)
    if not reserved.num_rows:
        return reserved
    settled = read_parts(storage, join(storage.root, "_llm", "ledger", stage), SETTLING)

    def pair(t: pa.Table) -> pa.Array:
        return pc.binary_join_element_wise(t["asker"], t["request_key"], "\x1f")

    return reserved.filter(pc.invert(pc.is_in(pair(reserved), value_set=pair(settled))))


def ledger_spend(storage: Storage, cfg: LLMConfig) -> dict[str, float]:
    """USD per LLM stage of the root, over every run: its ledger's answers, its requests in
    doubt (`in_doubt`) and the fleet's node-hours charged to it (`FleetMeter`)."""
    stages = {
        d.rstrip("/").rsplit("/", 1)[1]
        for kind in ("ledger", "reserved", "fleet")
        for d in storage.list_dirs(join(storage.root, "_llm", kind))
    }
    out = {}
    for stage in sorted(stages):
        table = read_parts(storage, join(storage.root, "_llm", "ledger", stage), COST_COLUMNS)
        doubt = pc.sum(in_doubt(storage, stage)["usd"]).as_py() or 0.0
        out[stage] = round(cost_usd(cfg, table) + doubt + fleet_spend(storage, stage), 6)
    return out


def fleet_spend(storage: Storage, stage: str) -> float:
    """USD of the fleet's node-hours charged to a stage, over every run."""
    charged = read_parts(storage, fleet_uri(storage, stage), FLEET, columns=["usd"])
    return pc.sum(charged["usd"]).as_py() or 0.0


@contextmanager
def counted_from_here(storage: Storage, cfg: LLMConfig) -> Iterator[None]:
    """Within the block, the caps count only spend added after it began (the refresh's)."""
    if cfg.max_usd is None and not any(o.max_usd for o in cfg.stages.values()):
        yield  # nothing is capped: no ledger to read
        return
    token = _BEFORE.set(ledger_spend(storage, cfg))
    try:
        yield
    finally:
        _BEFORE.reset(token)


def _usd(value: float) -> str:
    return f"${value:,.2f}"


@dataclass(frozen=True)
class Budget:
    """The caps one ask of a build stage runs under, and what was spent before it began."""

    stage: str
    root: str
    build_cap: float | None
    stage_cap: float | None
    build_before: float  # spent by the build (or this refresh) when the ask began
    stage_before: float  # spent by this stage, likewise
    refresh: bool  # counting from a refresh's start
    fleet: bool = False  # the fleet's node-hours count too (llm.fleet.node_hour_usd)

    @classmethod
    def open(cls, cfg: LLMConfig, storage: Storage, stage: str) -> Budget | None:
        """The stage's budget, or None when no cap applies to it (its ledger is not read)."""
        stage = stage_name(stage)
        options = cfg.stages.get(cast(LLMStage, stage))  # another name has no options: None
        stage_cap = options.max_usd if options else None
        if stage not in BUILD_LLM_STAGES or (cfg.max_usd is None and stage_cap is None):
            return None
        spent = ledger_spend(storage, cfg)
        before = _BEFORE.get()
        if before is not None:
            spent = {s: v - before.get(s, 0.0) for s, v in spent.items()}
        return cls(
            stage,
            storage.root,
            cfg.max_usd,
            stage_cap,
            sum(spent.values()),
            spent.get(stage, 0.0),
            before is not None,
            cfg.fleet.node_hour_usd is not None,
        )

    def room(self) -> float:
        """USD this ask may reserve at most: the least any cap leaves."""
        rooms = [
            cap - before
            for cap, before in (
                (self.stage_cap, self.stage_before),
                (self.build_cap, self.build_before),
            )
            if cap is not None
        ]
        return max(0.0, min(rooms) - MARGIN_USD)

    def check(self, new: float) -> None:
        """Stop with one line when a cap is reached, `new` USD having been spent by this ask."""
        stage_spent, build_spent = self.stage_before + new, self.build_before + new
        if self.stage_cap is not None and stage_spent >= self.stage_cap - MARGIN_USD:
            self.stop(new)
        if self.build_cap is not None and build_spent >= self.build_cap - MARGIN_USD:
            self.stop(new)

    def stop(self, new: float) -> None:
        """Raise the one line of a stop at the cap that binds, `new` USD spent by this ask: the
        request that would have passed it was not sent."""
        stage_spent, build_spent = self.stage_before + new, self.build_before + new
        left = {}
        if self.stage_cap is not None:
            left["stage"] = self.stage_cap - stage_spent
        if self.build_cap is not None:
            left["build"] = self.build_cap - build_spent
        if min(left, key=left.__getitem__) == "stage":
            key, cap, spent = f"llm.stages.{self.stage}.max_usd", self.stage_cap, stage_spent
            whose = "this stage's answers in its ledger"
        else:
            key, cap, spent = "llm.max_usd", self.build_cap, build_spent
            whose = (
                "this refresh's answers"
                if self.refresh
                else f"every LLM answer in the ledgers of {self.root}"
            )
        assert cap is not None  # `left` holds only the caps that are set
        priced = "llm.prices and the fleet's node-hours" if self.fleet else "llm.prices"
        raise SpendCapError(
            f"{self.stage}: stopped at the spend cap: {_usd(spent)} spent ({whose}, at "
            f"{priced}; {_usd(new)} by this run) against {key}={_usd(cap)}. Nothing was "
            f"published; the answers paid for are kept, and a rerun with a higher cap asks "
            f"only for the rest (e.g. --set {key}={_next_cap(cap, spent)})"
        )

    def progress(self, new: float) -> str:
        """The spend and caps for a progress line: `$1.20 (stage $3.10 of $5.00, …)`."""
        caps = []
        if self.stage_cap is not None:
            caps.append(f"stage {_usd(self.stage_before + new)} of {_usd(self.stage_cap)}")
        if self.build_cap is not None:
            whose = "refresh" if self.refresh else "build"
            caps.append(f"{whose} {_usd(self.build_before + new)} of {_usd(self.build_cap)}")
        return f"{_usd(new)} ({', '.join(caps)})"


def _next_cap(cap: float, spent: float) -> str:
    """A cap to suggest: twice the larger of the cap and what was spent, in whole dollars."""
    return f"{max(1, round(2 * max(cap, spent)))}"
