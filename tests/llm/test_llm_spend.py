"""The spend caps' arithmetic over real ledger parts (no endpoint, no Ray): what a build counts,
what a refresh counts, and the line that stops a stage. The caps stopping real stages, on both
asking paths, are in test_llm_reliability.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from cpr_ray.config import load_config
from cpr_ray.errors import SpendCapError
from cpr_ray.llm.spend import COST_COLUMNS, Budget, cost_usd, counted_from_here, ledger_spend
from cpr_ray.llm.spend_ledger import LEDGER, ledger_summary, ledger_uri
from cpr_ray.storage.store import Storage, join

# $1 per thousand prompt tokens, $2 per thousand completion tokens
PRICES = ["llm.prices.judge.input_per_mtok=1000", "llm.prices.judge.output_per_mtok=2000"]


def _setup(root: Path, *caps: str):
    cfg = load_config(
        "dry-run",
        env={},
        overrides=[f"storage.root={root}", "llm.model=judge", "llm.stages={}", *PRICES, *caps],
    )
    return cfg.llm, Storage(cfg.storage)


def _paid(
    storage: Storage, stage: str, part: str, prompt: int, completion: int, cached: int = 0
) -> None:
    """One ledger part of one answer with these tokens, as an asker flushes it."""
    row = {name: None for name in LEDGER.names}
    row.update(
        request_key=part, status="ok", model="judge", prompt_tokens=prompt,
        completion_tokens=completion, cached_prompt_tokens=cached,
    )  # fmt: skip
    table = pa.Table.from_pylist([row], schema=LEDGER)
    storage.write_parquet(table, join(ledger_uri(storage, stage), f"{part}.parquet"))


def test_a_build_counts_every_stage_in_the_roots_ledgers_and_a_refresh_only_its_own(tmp_path):
    llm, storage = _setup(tmp_path, "llm.max_usd=10", "llm.stages.judge-transfer.max_usd=4")
    _paid(storage, "judge-analogy", "a", 3000, 1000)  # $5
    _paid(storage, "judge-transfer", "b", 1000, 500)  # $2
    budget = Budget.open(llm, storage, "judge-transfer")
    assert (budget.build_before, budget.stage_before) == (7, 2)
    budget.check(1.5)  # $8.50 of 10, stage $3.50 of 4
    assert budget.progress(1.5) == "$1.50 (stage $3.50 of $4.00, build $8.50 of $10.00)"
    with pytest.raises(SpendCapError) as stage_cap:
        budget.check(2)
    assert str(stage_cap.value).startswith(
        "judge-transfer: stopped at the spend cap: $4.00 spent (this stage's answers in its "
        "ledger, at llm.prices; $2.00 by this run) against llm.stages.judge-transfer.max_usd="
        "$4.00. Nothing was published"
    )
    assert str(stage_cap.value).endswith("(e.g. --set llm.stages.judge-transfer.max_usd=8)")
    # judge-analogy has no stage cap: the build's is reached first
    with pytest.raises(SpendCapError, match=r"\$10.00 spent \(every LLM answer in the ledgers "):
        Budget.open(llm, storage, "judge-analogy").check(3)

    with counted_from_here(storage, llm):  # a refresh: what the build spent is not its own
        fresh = Budget.open(llm, storage, "judge-transfer")
        assert (fresh.build_before, fresh.stage_before) == (0, 0)
        _paid(storage, "judge-analogy", "c", 6000, 0)  # the refresh's new pairs: $6
        night = Budget.open(llm, storage, "judge-analogy")
        assert night.build_before == 6 and night.progress(0) == "$0.00 (refresh $6.00 of $10.00)"
        with pytest.raises(SpendCapError, match=r"\$10.00 spent \(this refresh's answers"):
            night.check(4)
    assert Budget.open(llm, storage, "judge-transfer").build_before == 13


def test_no_cap_no_budget_and_evaluation_steps_are_not_capped(tmp_path):
    llm, storage = _setup(tmp_path)
    assert Budget.open(llm, storage, "judge-analogy") is None
    capped, storage = _setup(tmp_path, "llm.max_usd=1")
    assert Budget.open(capped, storage, "rerank-choose") is None
    assert Budget.open(capped, storage, "judge_analogy") is not None  # either spelling


def test_prompt_tokens_served_from_the_cache_are_paid_at_the_cached_price(tmp_path):
    """$1 per thousand prompt tokens, $0.10 per thousand cached; a part written before the
    ledger had the column reads as none cached, at the full input price."""
    llm, storage = _setup(tmp_path, "llm.prices.judge.cached_input_per_mtok=100")
    _paid(storage, "judge-analogy", "a", 3000, 1000, cached=2000)  # $1 + $0.20 + $2
    old = LEDGER.remove(LEDGER.get_field_index("cached_prompt_tokens"))
    table = pa.Table.from_pylist(
        [{"request_key": "b", "status": "ok", "model": "judge", "prompt_tokens": 1000}], old
    )
    storage.write_parquet(table, join(ledger_uri(storage, "judge-analogy"), "b.parquet"))
    assert ledger_spend(storage, llm) == {"judge-analogy": pytest.approx(3.2 + 1.0)}
    (summary,) = ledger_summary(storage, llm)  # what `cpr stats` shows, over both parts
    assert (summary["prompt_tokens"], summary["cached_prompt_tokens"]) == (4000, 2000)
    assert summary["cost_usd"] == pytest.approx(4.2)
    # no cached price: cached tokens cost what any prompt token costs
    plain, _ = _setup(tmp_path)
    assert plain.prices["judge"].cached_input_per_mtok is None
    block = pa.table({"model": ["judge"], "prompt_tokens": [3000], "completion_tokens": [1000],
                      "cached_prompt_tokens": [2000]}, schema=COST_COLUMNS)  # fmt: skip
    assert cost_usd(plain, block) == pytest.approx(5.0)
    assert cost_usd(llm, block) == pytest.approx(3.2)
