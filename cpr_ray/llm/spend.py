"""What the build's LLM stages have spent, and the caps that stop them.

Spend is the ledgers' tokens at `llm.prices` (`cost_usd`): the ledger is written as answers
arrive and its rows are never changed (a compaction moves them into fewer files, and a read
counts each once), so it is the one record of what was paid, whichever run or machine paid it.
Two caps, both optional:

- `llm.max_usd`, the build's: every answer the root's ledgers hold, so a resumed build counts
  what its earlier stages and its stopped runs already spent;
- `llm.stages.<stage>.max_usd`, a stage's: every answer of that stage's ledger.

A nightly refresh adds to the same ledgers night after night; it counts only what it spends
itself (`counted_from_here`), so the cap is a night's and the build's spend does not use it up.

`run_llm_task` opens a `Budget` per ask and checks it before the first request and after every
block of answers: at a cap it stops asking (what is in flight is cancelled), the stage publishes
nothing, and a rerun with a higher cap is served what was paid from the cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import pyarrow as pa

from cpr_ray.compaction import read_parts
from cpr_ray.config import BUILD_LLM_STAGES, LLMConfig, stage_name
from cpr_ray.errors import SpendCapError
from cpr_ray.storage import Storage, join

# the ledger columns a cost needs (a part holds more; reading these is enough)
COST_COLUMNS = pa.schema(
    [
        ("model", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cached_prompt_tokens", pa.int64()),  # null in parts written before it: none cached
    ]
)

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


def ledger_spend(storage: Storage, cfg: LLMConfig) -> dict[str, float]:
    """USD per ledger stage folder of the root, over every run."""
    out = {}
    for stage_dir in storage.list_dirs(join(storage.root, "_llm", "ledger")):
        table = read_parts(storage, stage_dir, COST_COLUMNS)
        out[stage_dir.rstrip("/").rsplit("/", 1)[1]] = cost_usd(cfg, table)
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
        options = cfg.stages.get(stage)
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

    def check(self, new: float) -> None:
        """Stop with one line when a cap is reached, `new` USD having been spent by this ask."""
        stage_spent, build_spent = self.stage_before + new, self.build_before + new
        if self.stage_cap is not None and stage_spent >= self.stage_cap:
            key, cap, spent = f"llm.stages.{self.stage}.max_usd", self.stage_cap, stage_spent
            whose = "this stage's answers in its ledger"
        elif self.build_cap is not None and build_spent >= self.build_cap:
            key, cap, spent = "llm.max_usd", self.build_cap, build_spent
            whose = (
                "this refresh's answers"
                if self.refresh
                else f"every LLM answer in the ledgers of {self.root}"
            )
        else:
            return
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
