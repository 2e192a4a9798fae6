"""What the build's LLM stages have spent, and the caps that stop them.

Spend is the ledgers' tokens at `llm.prices` (`cost_usd`), plus every request *reserved* but
never settled (`in_doubt`): the ledger is written as answers arrive and its rows are never
changed (a compaction moves them into fewer files, and a read counts each once), and before a
request leaves its asker journals a reservation of its worst case under ``ROOT/_llm/reserved/``
(`llm.reserve`). A reservation whose asker wrote a ledger row for its request was settled by
that row; one with no such row belongs to an asker killed with the request in flight: paid or
not, nobody knows, so it counts at its worst case. Together they are the one record of what was
(or may have been) paid, whichever run or machine paid it. Two caps, both optional:

- `llm.max_usd`, the build's: every answer the root's ledgers hold, so a resumed build counts
  what its earlier stages and its stopped runs already spent;
- `llm.stages.<stage>.max_usd`, a stage's: every answer of that stage's ledger.

A nightly refresh adds to the same ledgers night after night; it counts only what it spends
itself (`counted_from_here`), so the cap is a night's and the build's spend does not use it up.

`run_llm_task` opens a `Budget` per ask and checks it before the first request; every request
then reserves its worst case from the room the budget leaves (`llm.reserve`), so spent plus
reserved never passes the cap, whatever the number of actors and requests in flight. At a cap
the askers send nothing more, store the answers still arriving, the stage publishes nothing,
and a rerun with a higher cap is served what was paid from the cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import BUILD_LLM_STAGES, LLMConfig, LLMStage, stage_name
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
    """USD per LLM stage of the root, over every run: its ledger's answers and its requests in
    doubt (`in_doubt`)."""
    stages = {
        d.rstrip("/").rsplit("/", 1)[1]
        for kind in ("ledger", "reserved")
        for d in storage.list_dirs(join(storage.root, "_llm", kind))
    }
    out = {}
    for stage in sorted(stages):
        table = read_parts(storage, join(storage.root, "_llm", "ledger", stage), COST_COLUMNS)
        doubt = pc.sum(in_doubt(storage, stage)["usd"]).as_py() or 0.0
        out[stage] = round(cost_usd(cfg, table) + doubt, 6)
    return out


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
        raise SpendCapError(
            f"{self.stage}: stopped at the spend cap: {_usd(spent)} spent ({whose}, at "
            f"llm.prices; {_usd(new)} by this run) against {key}={_usd(cap)}. Nothing was "
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
