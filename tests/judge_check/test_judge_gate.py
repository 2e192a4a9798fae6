"""The gate no constant judge passes (issue 44): scripted judges over the shipped gold, measured by
the same pure functions `cpr judge-check` reports with (`check.measure`), gated on the lower
bounds of κ's and precision's intervals; the exact intervals, Rogan–Gladen and the refusals of a
degenerate gate. Only the refusals go through the command (they stop before any request)."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cpr_ray.config import DatasetConfig, LLMConfig
from cpr_ray.cpr_command import app
from cpr_ray.errors import UserError
from cpr_ray.judge_check.agreement import (
    BaseRate,
    clopper_pearson,
    precision_at,
    rogan_gladen,
    rogan_gladen_interval,
)
from cpr_ray.judge_check.check import (
    CaseResult,
    analogy_precision_rate,
    base_rates,
    below,
    below_precision,
    degenerate_gates,
    measure,
)
from cpr_ray.judge_check.gate_report import WIDTH, stage_lines
from cpr_ray.judge_check.gold import JUDGE_STAGES, GoldCase, kept, load_gold
from cpr_ray.judge_check.gold_report import gold_summary
from cpr_ray.judge_check.projection import PASS_RATES, volumes_from_root
from cpr_ray.llm.spend_ledger import LEDGER
from cpr_ray.storage.store import Storage, StorageConfig
from tests.gold_fixtures import write_gold

runner = CliRunner()

# the label that lets a row through, and one that does not, per binarised stage
PASS = {
    "judge-analogy": "observed_analogy",
    "judge-transfer": "transfer",
    "write-queries": "accept",
    "dedup": "same",
    "score-positives": 3,
    "judge-negatives": 0,
}
FAIL = {
    "judge-analogy": "not_analogy",
    "judge-transfer": "background_only",
    "write-queries": "reject",
    "dedup": "different",
    "score-positives": 0,
    "judge-negatives": 3,
}


@pytest.fixture(scope="module")
def gold() -> dict[str, list[GoldCase]]:
    return {stage: load_gold(stage) for stage in JUDGE_STAGES}


def _wrong(stage: str, case: GoldCase) -> Any:
    """An answer that is not the case's label (for strongest: another candidate)."""
    if stage == "strongest":
        return 1 if case.label != 1 else 2
    return FAIL[stage] if kept(stage, case.label) else PASS[stage]


def always_pass(stage: str, cases: Sequence[GoldCase]) -> list[Any]:
    return [1 if stage == "strongest" else PASS[stage] for _ in cases]


def always_fail(stage: str, cases: Sequence[GoldCase]) -> list[Any]:
    return [len(c.input["candidates"]) if stage == "strongest" else FAIL[stage] for c in cases]


def majority_class(stage: str, cases: Sequence[GoldCase]) -> list[Any]:
    common = Counter(c.label for c in cases).most_common(1)[0][0]
    return [common for _ in cases]


def one_true_pass_only(stage: str, cases: Sequence[GoldCase]) -> list[Any]:
    """Passes the first case that deserves it, rightly, and nothing else."""
    first = next(i for i, c in enumerate(cases) if stage == "strongest" or kept(stage, c.label))
    if stage == "strongest":
        return [c.label if i == first else _wrong(stage, c) for i, c in enumerate(cases)]
    return [cases[first].label if i == first else FAIL[stage] for i, _ in enumerate(cases)]


def random_at_base_rate(stage: str, cases: Sequence[GoldCase]) -> list[Any]:
    """Passes each row with the probability a build's rows deserve it (seeded)."""
    rng = random.Random(44)
    if stage == "strongest":
        return [rng.randint(1, len(c.input["candidates"])) for c in cases]
    rate = PASS_RATES[stage][0]
    return [PASS[stage] if rng.random() < rate else FAIL[stage] for _ in cases]


CONSTANT_JUDGES: dict[str, Callable[[str, Sequence[GoldCase]], list[Any]]] = {
    "always-pass": always_pass,
    "always-fail": always_fail,
    "majority-class": majority_class,
    "one-true-pass-only": one_true_pass_only,
    "random-at-base-rate": random_at_base_rate,
}


def _results(cases: Sequence[GoldCase], answers: Sequence[Any]) -> list[CaseResult]:
    return [
        CaseResult(
            id=c.id,
            covers=c.covers,
            expected=c.label,
            got=a,
            status="ok",
            error=None,
            calls=1,
            prompt_tokens=1,
            completion_tokens=1,
            seconds=0.0,
            purpose=c.purpose,
        )
        for c, a in zip(cases, answers, strict=True)
    ]


def _report(stage: str, cases: Sequence[GoldCase], answers: Sequence[Any], rate=None) -> dict:
    if rate is None and stage != "strongest":
        rate = BaseRate("assumed", value=PASS_RATES[stage][0])
    return {"stages": [{"stage": stage, **measure(stage, _results(cases, answers), rate)}]}


@pytest.mark.parametrize("stage", JUDGE_STAGES)
@pytest.mark.parametrize("judge", CONSTANT_JUDGES)
def test_no_constant_judge_passes_the_kappa_gate_on_any_stage(gold, judge, stage):
    answers = CONSTANT_JUDGES[judge](stage, gold[stage])
    report = _report(stage, gold[stage], answers)
    assert below(report, 0.6), (judge, stage, report["stages"][0]["kappa_ci"])


def test_the_precision_gate_fails_exactly_the_judges_whose_lower_bound_is_under_the_bar(gold):
    cases = gold["judge-analogy"]
    for name, judge in CONSTANT_JUDGES.items():
        report = _report("judge-analogy", cases, judge("judge-analogy", cases))
        b = report["stages"][0]["binary"]
        low = None if b["precision"] is None else b["precision_ci"][0]
        for bar in (0.5, 0.8):
            assert bool(below_precision(report, bar)) == (low is None or low < bar), (name, bar)
        assert below_precision(report, 0.8), name  # at a 9% base rate none reaches 0.8
    # where the base rate exceeds the bar, passing everything reaches it: the κ gate stops it
    transfer = gold["judge-transfer"]
    report = _report("judge-transfer", transfer, always_pass("judge-transfer", transfer))
    assert not below_precision(report, 0.8) and below(report, 0.6)


def test_a_sensitive_judge_without_false_passes_clears_both_gates_on_the_analogy_gold(gold):
    cases = gold["judge-analogy"]
    positives = [i for i, c in enumerate(cases) if kept("judge-analogy", c.label)]
    missed = set(positives[: len(positives) // 10])  # sensitivity ≥ 0.9, no false pass
    answers = [FAIL["judge-analogy"] if i in missed else c.label for i, c in enumerate(cases)]
    report = _report("judge-analogy", cases, answers)
    b = report["stages"][0]["binary"]
    assert b["sensitivity"] >= 0.9 and b["specificity"] == 1.0
    assert not below(report, 0.6) and not below_precision(report, 0.8), b
    # the verifier's base rate is then this judge's precision, interval and all
    rate = analogy_precision_rate(report["stages"][0])
    assert rate is not None and rate.value == b["precision"] and rate.ci == tuple(b["precision_ci"])


def test_the_purpose_label_block_counts_observed_passes_on_background_citations(gold):
    cases = gold["judge-analogy"]
    report = _report("judge-analogy", cases, always_pass("judge-analogy", cases))
    block = report["stages"][0]["observed_on_not_taken"]
    labelled = [c for c in cases if c.purpose is not None]
    not_taken = [c for c in labelled if c.purpose in ("BACKGROUND", "COMPARES_CONTRASTS", "FUTURE")]
    assert block["passed"] == block["citations"] == len(not_taken) > 0
    assert block["gold_passed"] == sum(c.label == "observed_analogy" for c in not_taken)
    perfect = _report("judge-analogy", cases, [c.label for c in cases])
    assert perfect["stages"][0]["observed_on_not_taken"]["passed"] == block["gold_passed"]
    # printed as one more block of the stage, within 80 columns
    stage = report["stages"][0] | {"cases": len(cases), "model": "m"}
    stage |= {"base_rate_source": "assumed", "gold": gold_summary("judge-analogy", cases)}
    lines = stage_lines(stage)
    said = f"observed on background citations: {block['passed']} of {block['citations']}"
    assert any(said in line for line in lines), lines
    assert max(map(len, lines)) <= WIDTH


def test_exact_intervals_never_collapse_and_match_the_closed_forms():
    low, high = clopper_pearson(300, 300)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 300))  # ≈ 0.988
    low, high = clopper_pearson(0, 73)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 73))
    low, high = clopper_pearson(5, 10)
    assert low == pytest.approx(0.1871, abs=1e-4) and high == pytest.approx(0.8129, abs=1e-4)


def test_rogan_gladen_undoes_a_judges_own_pass_share():
    # the example: sens 0.9, spec 0.6, true rate 0.09 → it passes 44.5% of rows
    share = 0.9 * 0.09 + 0.4 * 0.91
    assert share == pytest.approx(0.445)
    assert rogan_gladen(share, 0.9, 0.6) == pytest.approx(0.09)
    assert precision_at(0.9, 0.6, rogan_gladen(share, 0.9, 0.6)) == pytest.approx(0.182, abs=1e-3)
    assert rogan_gladen(0.01, 0.9, 0.9) == 0.0  # clipped
    low, high = rogan_gladen_interval((0.40, 0.49), (0.85, 0.95), (0.55, 0.65))
    assert low < 0.09 < high
    with pytest.raises(ValueError, match="too close to chance"):
        rogan_gladen(0.5, 0.55, 0.5)


def test_a_build_pass_share_is_corrected_with_the_gold_and_refused_near_chance(gold):
    cases = gold["judge-analogy"]
    perfect = [c.label for c in cases]
    rate = BaseRate("a build", observed=(445, 1000))
    b = _report("judge-analogy", cases, perfect, rate)["stages"][0]["binary"]
    assert b["observed_pass_share"] == 0.445 and b["base_rate"] == 0.445  # a perfect judge
    with pytest.raises(ValueError, match="too close to chance"):
        _report("judge-analogy", cases, always_pass("judge-analogy", cases), rate)


def test_a_degenerate_gate_is_refused(gold, tmp_path):
    assert "--limit" in degenerate_gates(gold, 50)
    assert degenerate_gates(gold, None) is None  # the shipped gold holds ≥ 10 on each side
    few = {"judge-transfer": [c for c in gold["judge-transfer"] if c.label == "transfer"][:3]}
    assert "needs 10 on each side" in degenerate_gates(few, None)
    # through the command: one `error:` line, exit 2, before any request (no endpoint listens)
    folder = write_gold(tmp_path / "gold", {"dedup": ["same", "different"] * 4})
    for args in (["--limit", "1"], ["--gold", str(folder), "--stages", "dedup"]):
        out = tmp_path / "r.json"
        result = runner.invoke(
            app,
            ["judge-check", "--llm-base-url", "http://127.0.0.1:9/v1", "--min-kappa", "0.6",
             *args, "--out", str(out)],
        )  # fmt: skip
        assert result.exit_code == 2 and not out.exists(), result.output
        (line,) = [x for x in result.output.splitlines() if x.strip()][:1]
        assert line.startswith("error: judge-check:"), result.output
        assert "cannot reach" not in result.output


def test_a_build_rates_come_from_its_manifests_and_its_ledger_must_name_the_measured_model(
    tmp_path,
):
    """Under --root: the observed shares a build published (dedup's from its same-problem links
    over its comparisons, not the queries it kept), corrected later; refused in one line when
    the build's answers come from another model than the one measured."""
    for stage, body in {
        "mine": {"tables": {"pairs": {"uri": "x", "rows": 13_200}}},
        "judge-analogy": {"tables": {}, "stats": {"rows_in": 1_000, "rows_out": 445}},
        "dedup": {
            "tables": {},
            "stats": {
                "rows_in": 800,
                "rows_out": 700,
                "comparisons": 2_000,
                "same_problem_links": 300,
            },
        },  # fmt: skip
    }.items():
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "_MANIFEST.json").write_text(json.dumps(body))
    storage = Storage(StorageConfig(root=str(tmp_path)))
    vol = volumes_from_root(DatasetConfig(), storage)
    assert vol.observed == {"judge-analogy": (445, 1_000), "dedup": (300, 2_000)}
    llm = LLMConfig(base_url="http://x/v1", model="judge-m")
    rates = base_rates(vol, ["judge-analogy", "dedup", "judge-transfer"], llm, storage)
    assert rates["judge-analogy"].observed == (445, 1_000)
    assert rates["dedup"].observed == (300, 2_000)
    assert rates["judge-transfer"].value == PASS_RATES["judge-transfer"][0]
    assert "assumed" in rates["judge-transfer"].source
    ledger = tmp_path / "_llm" / "ledger" / "judge-analogy"
    ledger.mkdir(parents=True)
    row = {name: None for name in LEDGER.names} | {"model": "other-m", "status": "ok"}
    pq.write_table(pa.Table.from_pylist([row], schema=LEDGER), ledger / "part-0.parquet")
    with pytest.raises(UserError, match="come from other-m, not judge-m"):
        base_rates(vol, ["judge-analogy"], llm, storage)
