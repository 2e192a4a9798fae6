"""`cpr judge-check`: the gold loader and its refusals, the metrics (binarised κ, bootstrap
intervals, precision at a base rate), the projection of a whole build, and the command against
scripted judges whose confusion matrices are known (tests/standins/gold_llm.py), on tiny gold sets
the tests write (tests/gold_fixtures.py); the shipped gold files get one load test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpr_ray.config import DatasetConfig, LLMConfig, Price
from cpr_ray.config.llm import FleetConfig
from cpr_ray.cpr_command import app
from cpr_ray.errors import InputError, StorageError
from cpr_ray.judge_check.agreement import (
    BaseRate,
    agreement,
    binary_report,
    bootstrap,
    cohen_kappa,
    one_miss_step,
    precision_at,
    sensitivity_specificity,
)
from cpr_ray.judge_check.gate_report import WIDTH, projection_lines
from cpr_ray.judge_check.gold import (
    CONTEXT_STAGES,
    EXCLUSIONS,
    JUDGE_STAGES,
    LABELS,
    NO_STRUCTURE,
    gold_path,
    load_gold,
    select,
)
from cpr_ray.judge_check.gold_report import ONE_MISS_BAR, gold_summary
from cpr_ray.judge_check.projection import (
    PREFIX_SHARES,
    Measured,
    attempts,
    project,
    project_build,
    volumes,
    volumes_from_root,
)
from cpr_ray.llm.injection import instruction_flags
from cpr_ray.storage.store import Storage, StorageConfig
from tests.builds import REPO
from tests.gold_fixtures import gold_case, write_gold
from tests.standins.clients import ScriptedLLM
from tests.standins.gold_llm import gold_answers
from tests.standins.launch import standin, start_local_server

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# Flip to True when the gold writers' files are merged: every stage then ships a file in the
# new format with two readings per case, ≥ 60 cases and at least half of them real.
GOLD_MERGED = True
MIN_CASES, MIN_REAL_SHARE, REAL_CONTEXT_SHARE = 60, 0.5, 0.6


def _post_gold(handle: ScriptedLLM, entries: list[dict[str, Any]]) -> None:
    handle._post("/_gold", entries)


@pytest.fixture(scope="module")
def gold_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedLLM]:
    """The scripted endpoint with per-prompt answers (`/_gold`), empty until a test sets them."""
    log = tmp_path_factory.mktemp("gold-llm") / "gold.log"
    proc, url = start_local_server(
        [*standin("gold_llm"), "--port", "{port}"], "/health", log, cwd=REPO
    )
    yield ScriptedLLM(url)
    proc.terminate()
    proc.wait(timeout=10)


def _check(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["judge-check", *args, "--out", str(out)], env=env)
    report = json.loads(out.read_text()) if out.is_file() else None
    return result.exit_code, result.output, report


def _cases(folder: Path, stage: str):
    return load_gold(stage, gold_path(stage, folder))


# -- the shipped gold set ------------------------------------------------------------------------


def _shipped(stage: str) -> bool:
    """Whether the stage's shipped file is in the gold format (until the merge some are not:
    the old format has no readings, and the new stages have no file)."""
    path = gold_path(stage)
    if GOLD_MERGED:
        return True
    return path.is_file() and '"readings"' in path.read_text().splitlines()[0]


def test_the_shipped_gold_files_load_and_keep_the_rules():
    """Whatever ships loads under every rule of the loader (the method's included); the bar of
    the issue (size, real share, two readings, one miss ≤ 0.05) is GOLD_MERGED's."""
    ready = [s for s in JUDGE_STAGES if _shipped(s)]
    if not ready:
        pytest.skip("no shipped gold file is in the gold format yet (GOLD_MERGED is False)")
    for stage in ready:
        cases = load_gold(stage)
        summary = gold_summary(stage, cases)
        assert summary["real"] + summary["synthetic"] == len(cases)
        assert all(c.sources or c.citation for c in cases if not c.synthetic), stage
        if GOLD_MERGED:
            assert len(cases) >= MIN_CASES, stage
            assert summary["real"] >= MIN_REAL_SHARE * len(cases), stage
            assert summary["read_twice"] == len(cases), stage
            if stage != "strongest":
                assert summary["one_miss_kappa_step"] <= ONE_MISS_BAR, stage
            if stage in CONTEXT_STAGES:  # what a build sends: a real citing sentence
                real = sum(c.citing_sentence == "real" for c in cases)
                assert real >= REAL_CONTEXT_SHARE * len(cases), stage
    # the analogy gold's real negatives: the citation set's topic-different, double-read rows
    # (242 of them; the issue asked for 300, more than the set's 812 citations give honestly)
    negatives = [c for c in load_gold("judge-analogy") if c.citation and c.label == "not_analogy"]
    assert len(negatives) >= 240
    assert Counter(c.exclusion for c in negatives).most_common(1)[0][0] == "background_only"


# -- the loader ----------------------------------------------------------------------------------


def _refused(tmp_path: Path, stage: str, bad: dict[str, Any] | str) -> str:
    """The loader's message for a file whose second line is `bad` (FILE:LINE checked)."""
    good = json.dumps(gold_case(stage, 0, LABELS[stage][0]))
    path = tmp_path / f"{stage}.jsonl"
    path.write_text(good + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n")
    with pytest.raises(InputError) as err:
        load_gold(stage, path)
    assert str(err.value).startswith(f"{path}:2: "), str(err.value)
    return str(err.value)


def _unadjudicated(case: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in case.items() if k != "adjudication"}


def _drives(q_arguments: list[str], d_arguments: list[str]) -> dict[str, Any]:
    return {"predicate": "Drives", "q_arguments": q_arguments, "d_arguments": d_arguments}


def _transfer_case(**input_changes: Any) -> dict[str, Any]:
    case = gold_case("judge-transfer", 1, "transfer")
    case["input"] |= input_changes
    return case


@pytest.mark.parametrize(
    ("stage", "bad", "message"),
    [
        ("score-positives", "{not json", "not valid JSON"),
        ("score-positives", {"x": 1}, "unknown field(s) ['x']"),
        ("score-positives", gold_case("score-positives", 1, 5), "expected score must be one of"),
        (
            "score-positives",
            gold_case("score-positives", 1, 2, synthetic=False) | {"sources": []},
            "a real case (synthetic false) must name its 'sources'",
        ),
        (
            "dedup",
            gold_case("dedup", 1, "same") | {"adjudication": "not needed"},
            "'adjudication' belongs only to a case whose two readings differ",
        ),
        (
            "dedup",
            _unadjudicated(gold_case("dedup", 1, "same", second="different")),
            "the two readings differ, or the case passes a citation labelled background",
        ),
        (
            "dedup",
            gold_case("dedup", 1, "same") | {"expected": {"same_problem": False}},
            "'expected' (and 'exclusion') must equal the readings' label",
        ),
        (
            "judge-transfer",
            _transfer_case(object_mappings=[{"q_object": "lake", "d_object": "osc", "role": "r"}]),
            "needs at least two object mappings and one shared relation",
        ),
        (
            "judge-transfer",
            _transfer_case(shared_relations=[]),
            "needs at least two object mappings and one shared relation",
        ),
        (
            "judge-transfer",
            _transfer_case(shared_relations=[_drives(["lake", "lake"], ["oscillator"] * 2)]),
            "its arguments must be distinct object mappings",
        ),
        (
            "judge-transfer",
            _transfer_case(
                shared_relations=[_drives(["phosphorus", "lake"], ["oscillator", "drive"])]
            ),
            "its arguments must be distinct object mappings",
        ),
        (
            "judge-transfer",
            _transfer_case(decision="not_analogy"),
            "the verifier only sees pairs the analogy judge passed",
        ),
        (
            "judge-transfer",
            _transfer_case(transfer_type="tool_as_is"),
            "a passing judgment carries a contribution of d",
        ),
        ("strongest", gold_case("strongest", 1, 4), "expected index must name a candidate"),
        (
            "write-queries",
            gold_case("write-queries", 1, "reject") | {"expected": {"accept": False}},
            "a rejected query must name its 'fails'",
        ),
        (
            "write-queries",
            gold_case("write-queries", 1, "accept")
            | {"expected": {"accept": True, "fails": ["grounded"]}},
            "an accepted query has no 'fails'",
        ),
    ],
)
def test_the_loader_refuses_a_case_with_file_and_line(tmp_path, stage, bad, message):
    assert message in _refused(tmp_path, stage, bad)


def test_readings_that_differ_load_with_their_adjudication(tmp_path):
    path = tmp_path / "dedup.jsonl"
    path.write_text(json.dumps(gold_case("dedup", 1, "same", second="different")) + "\n")
    (case,) = load_gold("dedup", path)
    assert case.label == "same" and case.adjudication
    assert [r.label for r in case.readings] == ["same", "different"]
    adjudicated = gold_case("dedup", 1, "same", second="different")
    adjudicated["expected"] = {"same_problem": False}  # the second reading wins: allowed
    path.write_text(json.dumps(adjudicated) + "\n")
    assert load_gold("dedup", path)[0].label == "different"


def test_the_loader_checks_labels_readings_and_exclusions_per_stage(tmp_path):
    observed = gold_case("judge-analogy", 1, "observed_analogy")
    assert "expected decision must be one of" in _refused(
        tmp_path, "judge-analogy", observed | {"expected": {"decision": "maybe"}}
    )
    assert "belongs only to not_analogy" in _refused(
        tmp_path, "judge-analogy", observed | {"exclusion": "background_only"}
    )
    not_analogy = gold_case("judge-analogy", 1, "not_analogy")
    assert "needs 'exclusion', one of: same_problem" in _refused(
        tmp_path, "judge-analogy", not_analogy | {"exclusion": "vibes"}
    )
    second = dict(not_analogy["readings"][1], exclusion="surface_similarity")
    assert "the two readings differ" in _refused(
        tmp_path, "judge-analogy", not_analogy | {"readings": [not_analogy["readings"][0], second]}
    )
    assert "'readings' must be a list of 2 readings" in _refused(
        tmp_path, "judge-analogy", observed | {"readings": []}
    )
    swapped = [dict(r, reader=n) for r, n in zip(observed["readings"], ("second", "first"))]
    assert "'reader' must be 'first'" in _refused(
        tmp_path, "judge-analogy", observed | {"readings": swapped}
    )
    one = gold_case("judge-analogy", 1, "observed_analogy")
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(one) + "\n" + json.dumps(one) + "\n")
    with pytest.raises(InputError, match=r"one\.jsonl:2: case id .* appears twice"):
        load_gold("judge-analogy", path)
    one["readings"] = one["readings"][:1]  # the loader requires both readings
    assert "'readings' must be a list of 2 readings" in _refused(tmp_path, "judge-analogy", one)
    assert "'citing_sentence' must be one of" in _refused(
        tmp_path, "judge-analogy", observed | {"citing_sentence": None}
    )
    assert "none exactly when the input holds no contexts" in _refused(
        tmp_path, "judge-analogy", observed | {"citing_sentence": "none"}
    )


def _from_the_set(case: dict[str, Any], purpose: str) -> dict[str, Any]:
    topics = {"q_field": "Earth", "q_topic": "Hydrology", "d_field": "Physics",
              "d_topic": "Astronomy", "cross_field": True}  # fmt: skip
    return case | {
        "synthetic": False,
        "sources": {"unique_id": "CCT1", "core_id": "81153632"},
        "purpose": purpose,
        "topics": topics,
        "citing_sentence": "real",
    }


def test_a_case_from_the_citation_set_keeps_its_purpose_and_topics(tmp_path):
    observed = gold_case("judge-analogy", 1, "observed_analogy")
    uses = _from_the_set(observed, "USES")
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(uses) + "\n")
    (case,) = load_gold("judge-analogy", path)
    assert case.citation == {"unique_id": "CCT1", "core_id": "81153632"}
    assert case.purpose == "USES" and case.topics["cross_field"]
    # a pass as observed on a background citation needs a line saying why, readings agreeing
    background = _from_the_set(observed, "BACKGROUND")
    assert "passes a citation labelled background" in _refused(
        tmp_path, "judge-analogy", background
    )
    path.write_text(json.dumps(background | {"adjudication": "the sentence adapts d"}) + "\n")
    assert load_gold("judge-analogy", path)[0].adjudication == "the sentence adapts d"
    shared = dict(uses["topics"], d_topic="Hydrology", d_field="Earth", cross_field=False)
    assert "share a topic" in _refused(tmp_path, "judge-analogy", uses | {"topics": shared})
    assert "'purpose' must be one of" in _refused(
        tmp_path, "judge-analogy", uses | {"purpose": "CITES"}
    )
    assert "cross_field must say" in _refused(
        tmp_path, "judge-analogy", uses | {"topics": dict(uses["topics"], cross_field=False)}
    )


def test_limit_takes_cases_from_every_label_in_turn(tmp_path):
    labels = ["transfer"] * 3 + ["same_problem", "background_only", "unsupported_mappings"]
    folder = write_gold(tmp_path, {"judge-transfer": labels})
    cases = _cases(folder, "judge-transfer")
    picked = select(cases, 4)
    assert sorted(c.label for c in picked) == sorted(LABELS["judge-transfer"])
    assert select(cases, None) == cases


# -- the metrics ---------------------------------------------------------------------------------


def test_kappa_is_one_for_the_gold_zero_for_a_constant_rater_and_counts_invalid_as_wrong():
    gold = ["a", "b", "a", "c", "a"]
    assert cohen_kappa(gold, gold) == 1.0 and agreement(gold, gold) == 1.0
    assert cohen_kappa(gold, ["a"] * 5) == 0.0
    assert agreement(gold, ["a"] * 5) == 0.6
    # an unanswered case is a disagreement that adds nothing to chance agreement:
    # p_e = (3·2 + 1·1 + 1·1) / 25
    assert agreement(gold, ["a", "b", "a", "c", None]) == 0.8
    assert cohen_kappa(gold, ["a", "b", "a", "c", None]) == pytest.approx((0.8 - 0.32) / 0.68)
    assert cohen_kappa(["a", "a"], ["a", "a"]) == 1.0
    with pytest.raises(ValueError):
        cohen_kappa([], [])


def test_kappa_matches_scikit_learns_on_the_same_ratings():
    """κ against values scikit-learn's cohen_kappa_score gave for these ratings (computed once
    outside the suite: importing it costs seconds), and by hand: 7 of 12 agree, p_e = (2·2 +
    3·4 + 4·3 + 3·3)/144, κ = 47/107."""
    gold = [0, 1, 2, 3, 3, 2, 1, 0, 2, 2, 3, 1]
    judged = [1, 1, 2, 2, 3, 3, 0, 0, 2, 1, 3, 1]
    assert cohen_kappa(gold, judged) == pytest.approx(0.43925233644859807)
    assert cohen_kappa(gold, judged) == pytest.approx(47 / 107)
    binary = cohen_kappa([x >= 2 for x in gold], [x >= 2 for x in judged])
    assert binary == pytest.approx(0.8333333333333334)


def test_sensitivity_specificity_and_precision_at_a_base_rate_by_hand():
    gold = [True] * 10 + [False] * 10
    judged = [True] * 10 + [True, True] + [False] * 7 + [None]  # 2 false passes, 1 unanswered
    sens, spec = sensitivity_specificity(gold, judged)
    assert (sens, spec) == (1.0, 0.8)  # the unanswered row is not passed, as in a build
    # PPV = 1·0.09 / (1·0.09 + 0.2·0.91)
    assert precision_at(sens, spec, 0.09) == pytest.approx(0.09 / 0.272)
    assert precision_at(sens, spec, 0.5) == pytest.approx(1 / 1.2)
    assert precision_at(0.0, 1.0, 0.09) is None  # it passes nothing
    report = binary_report(gold, judged, BaseRate("assumed", value=0.09))
    assert report["false_per_100"] == pytest.approx(100 * (1 - 0.09 / 0.272), abs=0.05)
    # exact intervals: sensitivity 10/10, specificity 8/10; precision's from their corners
    assert report["sensitivity_ci"] == [round(0.025**0.1, 4), 1.0]
    spec_low, spec_high = report["specificity_ci"]
    assert spec_low == pytest.approx(0.4439, abs=1e-4) and spec_high == pytest.approx(
        0.9748, abs=1e-4
    )
    low, high = report["precision_ci"]
    assert low == pytest.approx(precision_at(0.025**0.1, spec_low, 0.09), abs=1e-4)
    assert high == pytest.approx(precision_at(1.0, spec_high, 0.09), abs=1e-4)
    assert low <= report["precision"] <= high
    assert report["false_per_100_ci"] == [round(100 * (1 - high), 1), round(100 * (1 - low), 1)]
    assert binary_report(gold, judged, None)["precision"] is None
    # the vectorised resamples are the scalar function's over the same seeded resamples
    assert report["kappa_ci"] == pytest.approx(
        bootstrap(20, lambda idx: cohen_kappa([gold[i] for i in idx], [judged[i] for i in idx])),
        abs=1e-4,
    )


def test_the_bootstrap_is_seeded_percentile_and_narrows_with_more_cases():
    def share(values: list[bool]):
        return lambda idx: sum(values[i] for i in idx) / len(idx)

    few = [True, False] * 10
    many = few * 16
    a, b = bootstrap(len(few), share(few)), bootstrap(len(few), share(few))
    assert a == b  # seeded
    assert a[0] < 0.5 < a[1]
    wide, narrow = a[1] - a[0], bootstrap(len(many), share(many))
    assert narrow[1] - narrow[0] < wide / 2  # four times the cases: about half the width
    assert bootstrap(5, lambda idx: 0.7) == pytest.approx((0.7, 0.7))
    assert bootstrap(5, lambda idx: None) is None


def test_one_miss_moves_kappa_by_at_most_the_bar_only_with_enough_cases():
    assert one_miss_step([True] * 30 + [False] * 30) <= ONE_MISS_BAR
    # one miss of a 12-case set: κ = (11/12 − p_e)/(1 − p_e), p_e = (6·7 + 6·5)/144
    step = one_miss_step([True] * 6 + [False] * 6)
    assert step == pytest.approx(1 - (11 / 12 - 72 / 144) / (1 - 72 / 144), abs=1e-4)
    assert step > ONE_MISS_BAR


# -- the projection ------------------------------------------------------------------------------


def test_the_projection_carries_rows_through_every_llm_stage():
    v = volumes(DatasetConfig())
    rows = v.rows
    assert rows["judge-analogy"] == 132_000
    assert rows["judge-transfer"] == round(132_000 * 0.09)
    assert rows["write-queries"] == round(132_000 * 0.09 * 0.9)
    written = 132_000 * 0.09 * 0.9 * (1 - 0.2**3)
    base = 9_217
    assert rows["dedup"] == round(base * (written / base) ** 2 / 2)  # Poisson: λ²/2 per paper
    assert rows["strongest"] == round(rows["dedup"] * 0.2)
    positives = (written - rows["dedup"] * 0.2) * 0.9
    train = positives - 1_300
    kept_negatives = 3 * (1_300 * 50 + train * 3)
    # judged, not kept: the walk's margin of 0.2 over a 90% negative rate
    assert rows["judge-negatives"] == round(kept_negatives * 1.2)
    assert rows["synthesize-queries"] == round(train)
    assert attempts(0.8) == pytest.approx(1.24)


def test_projection_from_known_means_prices_and_concurrency():
    llm = LLMConfig(
        model="m",
        actors=2,
        max_in_flight=5,
        prices={"m": Price(input_per_mtok=2.0, output_per_mtok=10.0)},
        max_usd=1.0,
    )
    measured = Measured(calls=1.5, prompt_tokens=1000, completion_tokens=100, seconds=2.0)
    p = project("judge-transfer", 1000, measured, llm)
    assert p["calls"] == 1500
    assert p["prompt_tokens"] == 1_000_000 and p["completion_tokens"] == 100_000
    assert p["usd"] == pytest.approx(1.0 * 2.0 + 0.1 * 10.0)
    assert p["usd_prefix_cached"] == p["usd"]  # no cached price: no discount
    cached = llm.model_copy(
        update={"prices": {"m": Price(input_per_mtok=2.0, output_per_mtok=10.0,
                                      cached_input_per_mtok=0.5)}}
    )  # fmt: skip
    share = PREFIX_SHARES["judge-transfer"]  # of the 1M prompt tokens, billed at $0.50 not $2
    assert project("judge-transfer", 1000, measured, cached)["usd_prefix_cached"] == pytest.approx(
        round(3.0 - share * (2.0 - 0.5), 2)
    )
    assert p["hours"] == round(1000 * 2.0 / (2 * 5) / 3600, 2)
    assert p["concurrency"] == 10
    other = LLMConfig(model="m", stages={"judge-transfer": {"model": "free?"}}, prices=llm.prices)
    assert project("judge-transfer", 10, measured, other)["usd"] is None
    # the strongest choice is the dedup stage's call: its model and price
    assert project("strongest", 10, measured, other)["model"] == "m"
    build = project_build(llm, {"judge-transfer": measured}, volumes(DatasetConfig()))
    names = [s["stage"] for s in build["stages"]]
    assert names[0] == "judge-analogy" and "write-queries" in names and "strongest" in names
    assert names[-1] == "synthesize-queries"
    t = build["total"]
    assert t["calls"] == sum(s["calls"] for s in build["stages"])
    assert t["usd_prefix_cached"] == pytest.approx(t["usd"], abs=0.05)  # no cached price
    assert f"USD with a prefix cache {t['usd_prefix_cached']:,.2f}" in "\n".join(
        projection_lines(build)
    )
    assert t["usd"] > build["max_usd"]
    review = Measured(calls=1.0, prompt_tokens=300, completion_tokens=30, seconds=1.0)
    wq = project_build(llm, {"write-queries": review}, volumes(DatasetConfig()))["stages"][2]
    n = attempts(0.8)  # extract + rewrite from the ledger, the review as measured, per attempt
    assert wq["calls"] == round(wq["rows"] * n * (2 + 1))
    assert wq["prompt_tokens"] == round(wq["rows"] * n * (958 * 2 / 3 + 300))


def test_the_projection_charges_a_priced_fleet_its_node_hours_against_the_cap():
    """On a fleet priced by the node-hour, each stage whose hours were measured costs hours ×
    llm.fleet.nodes × llm.fleet.node_hour_usd beside its tokens, as the spend ledger charges
    it; a build within the cap on tokens alone is over it with the fleet, and the report says
    both."""
    measured = Measured(calls=1.0, prompt_tokens=1000, completion_tokens=100, seconds=36.0)
    llm = LLMConfig(
        model="m",
        actors=1,
        max_in_flight=10,
        prices={"m": Price(input_per_mtok=0.1, output_per_mtok=0.3)},
        fleet={"node_hour_usd": 10.0, "nodes": 6},
    )
    one = project("judge-transfer", 1000, measured, llm)
    assert one["hours"] == 1.0  # 1,000 rows × 36 s ÷ 10 in flight
    assert (one["fleet_node_hours"], one["fleet_usd"]) == (6.0, 60.0)
    build = project_build(llm, {"judge-transfer": measured}, volumes(DatasetConfig()))
    fleet, tokens = build["fleet"], build["total"]["usd"]
    hours = [s["hours"] for s in build["stages"] if s["hours"] is not None]
    assert fleet["node_hours"] == pytest.approx(6 * sum(hours), abs=0.05)
    assert fleet["usd"] == pytest.approx(10 * fleet["node_hours"], abs=0.05)
    assert "synthesize-queries" in fleet["stages_without_hours"]  # no latency: n/a, not 0
    cap = round(tokens + fleet["usd"] / 2, 2)  # the tokens fit, the fleet does not
    capped = project_build(
        llm.model_copy(update={"max_usd": cap}),
        {"judge-transfer": measured},
        volumes(DatasetConfig()),
    )
    text = " ".join(" ".join(projection_lines(capped)).split())
    assert f"fleet: {fleet['node_hours']:,.2f} node-hours" in text
    assert f"llm.fleet.node_hour_usd $10.00: USD {fleet['usd']:,.2f}" in text
    total = tokens + fleet["usd"]
    assert f"USD {total:,.2f} (tokens {tokens:,.2f} + fleet {fleet['usd']:,.2f}) is over" in text
    unpriced = project_build(
        llm.model_copy(update={"fleet": FleetConfig()}), {}, volumes(DatasetConfig())
    )
    assert unpriced["fleet"] is None and "fleet:" not in " ".join(projection_lines(unpriced))


def test_the_judges_page_and_scale_md_tables_are_the_projection():
    """Both documents print the full-scale projection at the dry run's ledger tokens (the
    judges' page of the docs holds the table the README held)."""
    build = project_build(LLMConfig(), {}, volumes(DatasetConfig()))
    page = (ROOT / "docs" / "judges.md").read_text()
    scale_md = (ROOT / "benchmarks" / "SCALE.md").read_text()

    def m(tokens: int) -> str:
        return f"{tokens / 1e6:.1f}M"

    for s in build["stages"]:
        rows = f"{s['rows']:,}" + (" judged" if s["stage"] == "judge-negatives" else "")
        row = f"| {s['stage']} | {rows} | {s['calls']:,} | "
        row += f"{m(s['prompt_tokens'])} / {m(s['completion_tokens'])} |"
        assert row in page, row
        assert f"| {s['rows']:,}" in scale_md, s["stage"]
        assert f"| {m(s['prompt_tokens'])} | {m(s['completion_tokens'])} |" in scale_md
    t = build["total"]
    assert f"| {t['calls']:,} | {m(t['prompt_tokens'])} / {m(t['completion_tokens'])} |" in page
    assert f"about {t['calls'] / 1e3:.0f}k requests" in scale_md


def test_rows_and_pass_rates_come_from_a_build(tmp_path):
    def manifest(stage: str, body: dict[str, Any]) -> None:
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "_MANIFEST.json").write_text(json.dumps(body))

    manifest("mine", {"tables": {"pairs": {"uri": "x", "rows": 13_200}}})
    manifest("judge-analogy", {"tables": {}, "stats": {"rows_in": 13_000, "rows_out": 650}})
    v = volumes_from_root(DatasetConfig(), Storage(StorageConfig(root=str(tmp_path))))
    assert v.rows["judge-analogy"] == 13_000  # what it judged, not what it mined
    assert v.rates["judge-analogy"][0] == pytest.approx(0.05)
    assert v.rows["judge-transfer"] == 650
    assert v.rates["judge-transfer"][0] == 0.9  # not published: the assumption
    assert "13,200 mined pairs" in v.source and "judge-analogy" in v.source
    with pytest.raises(StorageError, match="no published mine stage"):
        volumes_from_root(DatasetConfig(), Storage(StorageConfig(root=str(tmp_path / "empty"))))


# -- the command against scripted judges ---------------------------------------------------------

SCRIPTED_GOLD: dict[str, list[Any]] = {  # ≥ 10 cases on each side of every binary: gates allowed
    "judge-analogy": ["observed_analogy"] * 5 + ["potential_analogy"] * 5 + ["not_analogy"] * 10,
    "judge-transfer": ["transfer"] * 10
    + ["same_problem"] * 4
    + ["background_only"] * 4
    + ["unsupported_mappings"] * 2,
    "write-queries": ["accept", "reject"] * 10,
    "dedup": ["same", "different"] * 10,
    "strongest": [1, 2, 3] * 4,
    "score-positives": [0, 1, 2, 3] * 5,
    "judge-negatives": [0, 1, 2, 3] * 5,
}
SWAP = {"observed_analogy": "potential_analogy", "potential_analogy": "observed_analogy"}
OFF_BY_ONE = {0: 1, 1: 0, 2: 3, 3: 2}


def _scripted_label(case: Any) -> Any:
    """The scripted judges: the analogy judge swaps observed and potential and passes two of
    the ten negatives; the verifier always says transfer; the reviewer is right but names
    another failure on one reject; dedup is perfect; strongest misses its last group; the
    positives' grader is off by one inside each band; the negatives' grader always says 0."""
    i = int(case.id.rsplit("-", 1)[1])
    stage = case.stage
    if stage == "judge-analogy":
        return SWAP.get(case.label, "observed_analogy" if i in (10, 11) else case.label)
    if stage == "judge-transfer":
        return "transfer"
    if stage == "write-queries":
        return ("reject", ["grounded"]) if i == 1 else case.label
    if stage == "strongest":
        return 1 if i == 5 else case.label
    if stage == "score-positives":
        return OFF_BY_ONE[case.label]
    if stage == "judge-negatives":
        return 0
    return case.label


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory, gold_llm):
    """One judge-check of every stage against the scripted judges, at 80 columns."""
    tmp = tmp_path_factory.mktemp("scripted")
    folder = write_gold(tmp / "gold", SCRIPTED_GOLD)
    cases = [c for s in JUDGE_STAGES for c in _cases(folder, s)]
    _post_gold(gold_llm, gold_answers(cases, _scripted_label))
    args = ["--llm-base-url", gold_llm.base_url, "--llm-model", "scripted", "--gold", str(folder)]
    args += ["--set", "llm.prices.scripted.input_per_mtok=3"]
    args += ["--set", "llm.prices.scripted.output_per_mtok=15", "--set", "llm.max_usd=100"]
    args += ["--min-kappa", "0.5", "--min-precision", "0.5"]
    return _check(tmp, *args, env={"COLUMNS": "80"})


def _stage(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["stages"] if s["stage"] == name)


def test_scripted_judges_get_the_kappa_and_precision_computed_by_hand(scripted_run):
    code, output, report = scripted_run
    a = _stage(report, "judge-analogy")
    # pass vs not: sens 1, spec 0.8; p_o 0.9, p_e 0.5·0.6 + 0.5·0.4 = 0.5, κ 0.8
    assert a["binary"]["sensitivity"] == 1.0 and a["binary"]["specificity"] == 0.8
    assert a["kappa"] == 0.8
    # the three labels: agreement 8/20; p_e = (5·7 + 5·5 + 10·8)/400 = 0.35
    assert a["agreement"] == 0.4
    assert a["kappa_labels"] == pytest.approx((0.4 - 0.35) / 0.65, abs=1e-4)
    assert a["binary"]["precision"] == pytest.approx(0.09 / 0.272, abs=1e-4)
    assert a["binary"]["false_per_100"] == 66.9
    low, high = a["kappa_ci"]
    assert low < 0.8 < high <= 1.0
    # constant: κ 0, precision = its base rate, which is the analogy judge's precision
    t = _stage(report, "judge-transfer")
    assert t["kappa"] == 0.0 and t["binary"]["sensitivity"] == 1.0
    assert t["binary"]["base_rate"] == a["binary"]["precision"]
    assert t["binary"]["base_rate_ci"] == a["binary"]["precision_ci"]
    assert t["binary"]["precision"] == pytest.approx(a["binary"]["precision"], abs=1e-4)
    assert "analogy judge's measured precision" in t["base_rate_source"]
    w = _stage(report, "write-queries")
    assert w["kappa"] == 1.0 and w["fails_named"] == {"same": 9, "cases": 10}
    assert _stage(report, "dedup")["binary"]["false_per_100"] == 0.0
    s = _stage(report, "strongest")  # 11 of 12; p_e = (4·5 + 4·4 + 4·3)/144
    assert s["binary"] is None and s["agreement"] == pytest.approx(11 / 12, abs=1e-4)
    assert s["kappa"] == pytest.approx((11 / 12 - 1 / 3) / (2 / 3), abs=1e-4)
    p = _stage(report, "score-positives")  # off by one inside each band: the binary is perfect
    assert p["kappa"] == 1.0 and p["agreement"] == 0.0
    assert p["kappa_labels"] == pytest.approx(-0.25 / 0.75, abs=1e-4)
    n = _stage(report, "judge-negatives")  # always 0: every candidate kept as a negative
    assert n["kappa"] == 0.0 and n["binary"]["false_per_100"] == 10.0
    assert "assumed" in n["base_rate_source"]
    assert all(x["invalid_rate"] == 0.0 for x in report["stages"])


def test_the_gates_exit_2_naming_each_stage_below_its_bar(scripted_run):
    """The gates read lower bounds: a constant judge's κ interval is [0, 0]; a perfect
    reviewer clears both bars; the analogy judge's precision is low at its 9% base rate."""
    code, output, report = scripted_run
    assert code == 2
    said = " ".join(output.split())
    assert "error: judge-check: " in said and "below --min-kappa 0.5, --min-precision 0.5" in said
    failing = said[said.index("error: judge-check: ") :]
    for part in (
        "judge-transfer κ lower bound 0.00",
        "judge-negatives κ lower bound 0.00",
        "judge-analogy precision lower bound",
        "judge-transfer precision lower bound",
    ):
        assert part in failing, part
    assert "write-queries" not in failing and "score-positives" not in failing
    assert report is not None  # the report is written first


def test_every_figure_reads_in_full_at_80_columns(scripted_run):
    _, output, report = scripted_run
    start = output.index("judge-check: the build's judges")
    lines = output[start : output.index("report written to")].splitlines()
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)
    assert "…" not in output
    for s in report["stages"]:
        block = output[output.index(f"{s['stage']}: {s['cases']} cases") :]
        assert f"κ {s['kappa']:.2f} [{s['kappa_ci'][0]:.2f}, {s['kappa_ci'][1]:.2f}]" in block
        if s["binary"]:
            b = s["binary"]
            assert f"κ {s['kappa_labels']:.2f}, agreement {s['agreement']:.2f}" in block
            assert f"about {b['false_per_100']:.0f}" in block
            lo, hi = b["false_per_100_ci"]
            assert f"[{lo:.0f}, {hi:.0f}]" in block
        assert f"{s['mean']['prompt_tokens']:,.0f} prompt" in block
    p = report["projection"]
    for s in p["stages"]:
        row = next(line for line in lines if line.startswith(s["stage"] + " "))
        assert f"{s['rows']:,}" in row and f"{s['calls']:,}" in row and f"{s['usd']:,.2f}" in row
    assert f"{p['total']['usd']:,.2f} is over the build's cap llm.max_usd 100.00" in output


def test_a_judge_that_answers_the_gold_gets_kappa_one_on_every_stage(tmp_path, gold_llm):
    folder = write_gold(tmp_path / "gold", SCRIPTED_GOLD)
    cases = [c for s in JUDGE_STAGES for c in _cases(folder, s)]
    _post_gold(gold_llm, gold_answers(cases))
    code, output, report = _check(
        tmp_path,
        "--profile",
        "dry-run",
        "--llm-base-url",
        gold_llm.base_url,
        "--llm-model",
        "scripted",
        "--gold",
        str(folder),
        "--min-kappa",
        "0.99",
    )
    assert code == 0, output
    assert [s["stage"] for s in report["stages"]] == list(JUDGE_STAGES)
    for s in report["stages"]:
        assert s["agreement"] == 1.0 and s["kappa"] == 1.0, (s["stage"], s["confusion"])
        assert s["invalid_rate"] == 0.0 and s["mean"]["calls"] == 1.0
        assert s["mean"]["prompt_tokens"] > 0
        if s["binary"]:
            assert s["binary"]["precision"] == 1.0 and s["binary"]["false_per_100"] == 0.0
    analogy = report["stages"][0]
    if analogy["exclusions_named"] is not None:
        assert analogy["exclusions_named"] == {"named": 10, "alone": 10, "cases": 10}
    assert report["pins_ignored"] and "judge-check ignores pins" in " ".join(output.split())


def test_a_judge_that_always_passes_gets_the_kappa_of_a_constant_rater(tmp_path, llm):
    folder = write_gold(tmp_path / "gold", SCRIPTED_GOLD)
    code, output, report = _check(
        tmp_path,
        "--llm-base-url",
        llm.base_url,
        "--llm-model",
        "scripted",
        "--gold",
        str(folder),
        "--stages",
        "judge_transfer,score-positives",
    )
    assert code == 0, output
    assert not report["pins_ignored"] and not report["embedded_server"]
    for s, passing in zip(report["stages"], ("transfer", 3), strict=True):
        gold = SCRIPTED_GOLD[s["stage"]]
        assert s["labels"]["judged"] == {str(passing): len(gold)}
        assert s["kappa"] == 0.0 and s["binary"]["sensitivity"] == 1.0
        assert s["binary"]["specificity"] == 0.0
        assert s["agreement"] == pytest.approx(gold.count(passing) / len(gold), abs=1e-4)


def test_the_gold_report_needs_no_endpoint(tmp_path):
    """The readers' agreement by hand: 11 write-queries cases, the second reader rejects two
    the first accepts: p_o 9/11; first 6/5, second 4/7: p_e = (6·4 + 5·7)/121, κ = 40/62."""
    folder = tmp_path / "gold"
    folder.mkdir()
    lines = [
        gold_case("write-queries", i, lab, second="reject" if i in (0, 2) else "same")
        for i, lab in enumerate(["accept", "reject"] * 5)
    ]
    lines += [gold_case("write-queries", 10, "accept", synthetic=False)]
    (folder / "write-queries.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = runner.invoke(
        app, ["judge-check", "--gold-report", "--gold", str(folder), "--stages", "write-queries"]
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "11 cases: 1 real, 10 synthetic" in out
    assert "classes accept 6, reject 5" in out
    assert f"readers κ {40 / 62:.2f}" in out and f"agreement {9 / 11:.2f}" in out
    assert "11 read twice, 2 adjudicated" in out


def test_unknown_stage_is_one_line(tmp_path):
    code, output, _ = _check(
        tmp_path, "--stages", "synthesize-queries", "--llm-base-url", "http://x"
    )
    assert code == 2 and "--stages: synthesize-queries not judged" in output


def test_an_endpoint_that_is_not_listening_is_one_line(tmp_path):
    folder = write_gold(tmp_path / "gold", {"score-positives": [0, 3]})
    code, output, report = _check(
        tmp_path,
        "--llm-base-url",
        "http://127.0.0.1:9/v1",
        "--stages",
        "score-positives",
        "--gold",
        str(folder),
    )
    assert code == 2 and report is None
    assert "error: cannot reach the LLM endpoint http://127.0.0.1:9/v1" in output


FIRST_FOUR = ("judge-analogy", "judge-transfer", "score-positives", "judge-negatives")


@pytest.mark.skipif(not GOLD_MERGED, reason="the shipped files change format at the gold merge")
def test_the_gold_set_covers_every_rule_it_must():
    cases = {s: load_gold(s) for s in FIRST_FOUR}
    assert sum(len(c) for c in cases.values()) >= 48
    analogy = Counter(c.label for c in cases["judge-analogy"])
    assert len(cases["judge-analogy"]) >= 18
    assert analogy["observed_analogy"] >= 2 and analogy["potential_analogy"] >= 2
    exclusions = Counter(c.exclusion for c in cases["judge-analogy"] if c.exclusion)
    # every exclusion but one is some case's adjudicated label. "Adoption without relational
    # transfer" is not: each of the eight cases written for it was read otherwise by the second
    # reader and adjudicated so (a generic technique carried over by its mappings is a transfer;
    # without citing text nothing shows an adoption at all), so it stays exercised only by the
    # first readings, which `readings` keeps
    assert set(exclusions) == {*EXCLUSIONS, NO_STRUCTURE} - {"adoption_without_transfer"}
    first = {r.exclusion for c in cases["judge-analogy"] for r in c.readings[:1]}
    assert "adoption_without_transfer" in first
    transfer = Counter(c.label for c in cases["judge-transfer"])
    assert len(cases["judge-transfer"]) >= 10 and transfer["transfer"] >= 3
    assert all(transfer[r] >= 2 for r in LABELS["judge-transfer"][1:])
    assert any("general technique" in c.covers for c in cases["judge-transfer"])
    for stage in ("score-positives", "judge-negatives"):
        scores = Counter(c.label for c in cases[stage])
        assert len(cases[stage]) >= 10 and all(scores[s] >= 2 for s in range(4)), stage
        assert all(c.input["mappings"] is None for c in cases[stage] if stage == "judge-negatives")
    covers = " ".join(c.covers for c in cases["score-positives"])
    assert "different field" in covers and "same topic" in covers


@pytest.mark.skipif(not GOLD_MERGED, reason="the shipped files change format at the gold merge")
def test_gold_texts_are_abstract_sized_clean_and_answerable_by_the_scripted_rules():
    """An invented abstract reads like a real one: 80–160 words (a real one is as its source
    gives it); no text holds what an injection check flags, nor one of the markers that make
    tests/standins/scripted_llm.py answer otherwise than its passing default."""
    markers = ("SAME", "UNRELATED", "INCONSISTENT", "REJECT", "USELESS", "PLAINSCORE")
    for stage in FIRST_FOUR:
        for case in load_gold(stage):
            row = case.input
            if "passage" in row:
                title, _, abstract = row["passage"].partition(". ")
                texts, abstracts = [title, abstract], [abstract]
            else:
                texts = [row["q_title"], row["q_abstract"], row["d_title"], row["d_abstract"]]
                texts += row["contexts"]
                abstracts = [row["q_abstract"], row["d_abstract"]]
            if case.synthetic:
                for text in abstracts:
                    assert 80 <= len(text.split()) <= 160, (case.id, text[:60])
            for text in texts:
                assert not instruction_flags(text), (case.id, text[:60])
                assert not any(m in text for m in markers), (case.id, text[:60])


def test_the_gold_files_ship_as_package_data(tmp_path):
    """The wheel a user installs holds every stage's gold file, byte for byte: built from a copy
    of the package (so the checkout gets no build folders) by pip, as `make` and the images do,
    with the backend already installed (about 2 s)."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "cpr_ray", src / "cpr_ray", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*build, "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("cpr_ray-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = sorted((ROOT / "cpr_ray" / "judge_check" / "gold").glob("*.jsonl"))
        assert len(shipped) >= (len(JUDGE_STAGES) if GOLD_MERGED else 4)
        for path in shipped:
            rel = path.relative_to(ROOT).as_posix()
            assert rel in zf.namelist(), f"{rel} is not in {wheel.name}"
            assert zf.read(rel) == path.read_bytes(), rel
        # the citation set's licence travels with the texts copied from it
        assert "cpr_ray/judge_check/gold/LICENSE-CORE-MIT.txt" in zf.namelist()


@pytest.mark.slow
def test_the_embedded_placeholder_fails_the_gate_on_dedup(tmp_path):
    """The embedded llama-server (Gemma 3 270M base) on a whole dedup stage (its shortest
    answers) of the smallest gold a gate accepts, 10 same-problem and 10 different cases of the
    shipped set: measured like any judge, and stopped by the κ gate on its lower bound."""
    cases = [json.loads(line) for line in gold_path("dedup").read_text().splitlines()]
    same = [c for c in cases if c["expected"]["same_problem"]][:10]
    other = [c for c in cases if not c["expected"]["same_problem"]][:10]
    folder = tmp_path / "gold"
    folder.mkdir()
    (folder / "dedup.jsonl").write_text("".join(json.dumps(c) + "\n" for c in same + other))
    code, output, report = _check(
        tmp_path, "--stages", "dedup", "--gold", str(folder), "--min-kappa", "0.6"
    )
    assert code == 2, output
    assert report["embedded_server"] and report["pins_ignored"]
    (s,) = report["stages"]
    assert s["cases"] == 20 and s["kappa_ci"][0] < 0.6
    said = " ".join(output.split())
    assert f"dedup κ lower bound {s['kappa_ci'][0]:.2f}" in said
    assert "embedded placeholder" in said
