"""`cpr judge-check`: the gold set, the loader, κ, the projection, and the command against the
scripted endpoint (a judge that answers the gold, and one that always passes) and, once, the
embedded llama-server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpr_ray.cli import app
from cpr_ray.config import LLMConfig, Price
from cpr_ray.errors import InputError, StorageError
from cpr_ray.judge_check.gold import (
    EXCLUSIONS,
    JUDGE_STAGES,
    LABELS,
    NO_STRUCTURE,
    gold_path,
    load_gold,
    select,
)
from cpr_ray.judge_check.metrics import agreement, at_least, cohen_kappa
from cpr_ray.judge_check.projection import SCALE_ROWS, Measured, project, rows_from_root
from cpr_ray.llm.injection import instruction_flags
from cpr_ray.storage import Storage, StorageConfig
from tests.conftest import ScriptedLLM, start_local_server
from tests.gold_llm import gold_answers

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
PASSING = {
    "judge-analogy": "observed_analogy",
    "judge-transfer": "transfer",
    "score-positives": 3,
    "judge-negatives": 3,
}


@pytest.fixture(scope="module")
def gold_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedLLM]:
    """The scripted endpoint answering every gold case with its expected label."""
    log = tmp_path_factory.mktemp("gold-llm") / "gold.log"
    script = str(Path(__file__).parent / "gold_llm.py")
    proc, url = start_local_server([sys.executable, script, "--port", "{port}"], "/health", log)
    handle = ScriptedLLM(url)
    cases = [c for s in JUDGE_STAGES for c in load_gold(s)]
    req = urllib.request.Request(
        f"{url}/_gold",
        data=json.dumps(gold_answers(cases)).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()
    yield handle
    proc.terminate()
    proc.wait(timeout=10)


def _check(tmp_path: Path, *args: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["judge-check", *args, "--out", str(out)])
    report = json.loads(out.read_text()) if out.is_file() else None
    return result.exit_code, result.output, report


# -- the gold set --------------------------------------------------------------------------------


def test_the_gold_set_covers_every_rule_it_must():
    cases = {s: load_gold(s) for s in JUDGE_STAGES}
    assert sum(len(c) for c in cases.values()) >= 48
    analogy = Counter(c.label for c in cases["judge-analogy"])
    assert len(cases["judge-analogy"]) >= 18
    assert analogy["observed_analogy"] >= 2 and analogy["potential_analogy"] >= 2
    exclusions = Counter(c.exclusion for c in cases["judge-analogy"] if c.exclusion)
    assert set(exclusions) == {*EXCLUSIONS, NO_STRUCTURE}
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


def test_gold_texts_are_abstract_sized_clean_and_answerable_by_the_scripted_rules():
    """80–160 words per abstract; nothing an injection check flags; none of the markers that
    make tests/scripted_llm.py answer otherwise than its passing default."""
    markers = ("SAME", "UNRELATED", "INCONSISTENT", "REJECT", "USELESS", "PLAINSCORE")
    for stage in JUDGE_STAGES:
        for case in load_gold(stage):
            row = case.input
            if "passage" in row:
                title, _, abstract = row["passage"].partition(". ")
                texts = [title, abstract]
            else:
                texts = [row["q_title"], row["q_abstract"], row["d_title"], row["d_abstract"]]
                texts += row["contexts"]
                for side in ("q_abstract", "d_abstract"):
                    assert 80 <= len(row[side].split()) <= 160, (case.id, side)
            if "passage" in row:
                assert 80 <= len(abstract.split()) <= 160, case.id
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
        for stage in JUDGE_STAGES:
            rel = gold_path(stage).relative_to(ROOT).as_posix()
            assert rel in zf.namelist(), f"{rel} is not in {wheel.name}"
            assert zf.read(rel) == gold_path(stage).read_bytes(), rel


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        (
            '{"id": "x", "covers": "c", "why": "w", "input": {}, "expected": {"score": 1}}',
            "input lacks column(s) query, passage, mappings",
        ),
        ("SCORE5", "expected score must be one of [0, 1, 2, 3], got 5"),
        ("EXTRA", "unknown field(s) ['label']"),
    ],
)
def test_the_loader_names_the_file_and_line_of_a_malformed_case(tmp_path, line, message):
    good = gold_path("score-positives").read_text().splitlines()[0]
    case = json.loads(good)
    if line == "SCORE5":
        line = json.dumps({**case, "expected": {"score": 5}})
    elif line == "EXTRA":
        line = json.dumps({**case, "label": 2})
    path = tmp_path / "score-positives.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(InputError) as err:
        load_gold("score-positives", path)
    assert str(err.value).startswith(f"{path}:2: ")
    assert message in str(err.value)


def test_the_loader_checks_labels_and_exclusions_per_stage(tmp_path):
    lines = gold_path("judge-analogy").read_text().splitlines()
    observed = json.loads(lines[0])
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({**observed, "expected": {"decision": "maybe"}}) + "\n")
    with pytest.raises(InputError, match=r"a\.jsonl:1: expected decision must be one of"):
        load_gold("judge-analogy", path)
    path.write_text(json.dumps({**observed, "exclusion": "background_only"}) + "\n")
    with pytest.raises(InputError, match="belongs only to not_analogy"):
        load_gold("judge-analogy", path)
    not_analogy = json.loads(next(x for x in lines if '"not_analogy"' in x))
    path.write_text(json.dumps({**not_analogy, "exclusion": "vibes"}) + "\n")
    with pytest.raises(InputError, match="needs 'exclusion', one of: same_problem"):
        load_gold("judge-analogy", path)
    transfer = json.loads(gold_path("judge-transfer").read_text().splitlines()[0])
    path.write_text(
        json.dumps({**transfer, "expected": {"verdict": "reject", "reject_reason": "dull"}}) + "\n"
    )
    with pytest.raises(InputError, match="reject_reason must be one of same_problem"):
        load_gold("judge-transfer", path)
    path.write_text(json.dumps(transfer) + "\n" + json.dumps(transfer) + "\n")
    with pytest.raises(InputError, match=r":2: case id .* appears twice"):
        load_gold("judge-transfer", path)


def test_limit_takes_cases_from_every_label_in_turn():
    cases = load_gold("judge-transfer")
    picked = select(cases, 4)
    assert sorted(c.label for c in picked) == sorted(LABELS["judge-transfer"])
    assert select(cases, None) == cases


# -- κ and the projection -----------------------------------------------------------------------


def test_kappa_is_one_for_the_gold_zero_for_a_constant_rater_and_counts_invalid_as_wrong():
    gold = ["a", "b", "a", "c", "a"]
    assert cohen_kappa(gold, gold) == 1.0 and agreement(gold, gold) == 1.0
    assert cohen_kappa(gold, ["a"] * 5) == 0.0
    assert agreement(gold, ["a"] * 5) == 0.6
    # an unanswered case is a disagreement that adds nothing to chance agreement:
    # p_e = (3·2 + 1·1 + 1·1) / 25
    assert agreement(gold, ["a", "b", "a", "c", None]) == 0.8
    assert cohen_kappa(gold, ["a", "b", "a", "c", None]) == pytest.approx((0.8 - 0.32) / 0.68)
    # the degenerate case: one label on both sides, every case agreed
    assert cohen_kappa(["a", "a"], ["a", "a"]) == 1.0
    assert at_least([0, 2, 3, None], 2) == [False, True, True, None]
    with pytest.raises(ValueError):
        cohen_kappa([], [])


def test_projection_from_known_means_prices_and_concurrency():
    llm = LLMConfig(
        model="m",
        actors=2,
        max_in_flight=5,
        prices={"m": Price(input_per_mtok=2.0, output_per_mtok=10.0)},
    )
    measured = Measured(calls=1.5, prompt_tokens=1000, completion_tokens=100, seconds=2.0)
    p = project("judge-transfer", 1000, measured, llm)
    assert p["calls"] == 1500
    assert p["prompt_tokens"] == 1_000_000 and p["completion_tokens"] == 100_000
    assert p["usd"] == pytest.approx(1.0 * 2.0 + 0.1 * 10.0)
    assert p["hours"] == round(1000 * 2.0 / (2 * 5) / 3600, 2)
    assert p["concurrency"] == 10
    # a stage's own model, and no price for it: USD unknown rather than 0
    other = LLMConfig(model="m", stages={"judge-transfer": {"model": "free?"}}, prices=llm.prices)
    assert project("judge-transfer", 10, measured, other)["usd"] is None


def test_rows_come_from_a_builds_mined_pairs(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "_MANIFEST.json").write_text(
        json.dumps({"tables": {"pairs": {"uri": "x", "rows": 13_200}}})
    )
    rows, source = rows_from_root(Storage(StorageConfig(root=str(tmp_path))))
    assert rows == {
        "judge-analogy": 13_200,
        "judge-transfer": 1_200,
        "score-positives": 1_200,
        "judge-negatives": 29_000,
    }
    assert "13,200 mined pairs" in source
    with pytest.raises(StorageError, match="no published mine stage"):
        rows_from_root(Storage(StorageConfig(root=str(tmp_path / "empty"))))


# -- the command against scripted judges ---------------------------------------------------------


def test_a_judge_that_answers_the_gold_gets_kappa_one_on_every_stage(tmp_path, gold_llm):
    code, output, report = _check(
        tmp_path,
        "--profile",
        "dry-run",
        "--llm-base-url",
        gold_llm.base_url,
        "--llm-model",
        "scripted",
        "--min-kappa",
        "0.99",
    )
    assert code == 0, output
    assert [s["stage"] for s in report["stages"]] == list(JUDGE_STAGES)
    for s in report["stages"]:
        assert s["agreement"] == 1.0 and s["kappa"] == 1.0, (s["stage"], s["confusion"])
        assert s["invalid_rate"] == 0.0
        assert s["mean"]["prompt_tokens"] > 0 and s["mean"]["calls"] == 1.0
        assert s["projection"]["rows"] == SCALE_ROWS[s["stage"]]
        if "kappa_at_2" in s:
            assert s["kappa_at_2"] == 1.0
    analogy = report["stages"][0]
    if analogy["exclusions_named"] is not None:  # the judge's answer names its exclusions
        assert analogy["exclusions_named"] == {"named": 10, "alone": 10, "cases": 10}
    # the dry-run profile pins the placeholder's answers: the check says it ignored them
    assert report["pins_ignored"] and "judge-check ignores pins" in output
    assert "judge check" in output and "κ" in output


def test_a_judge_that_always_passes_gets_the_kappa_of_a_constant_rater(tmp_path, llm):
    code, output, report = _check(
        tmp_path, "--llm-base-url", llm.base_url, "--llm-model", "scripted"
    )
    assert code == 0, output
    assert not report["pins_ignored"] and not report["embedded_server"]
    for s in report["stages"]:
        gold = [c.label for c in load_gold(s["stage"])]
        assert s["labels"]["judged"] == {str(PASSING[s["stage"]]): len(gold)}, s["stage"]
        assert s["kappa"] == 0.0
        assert s["agreement"] == pytest.approx(
            gold.count(PASSING[s["stage"]]) / len(gold), abs=1e-4
        )


def test_min_kappa_exits_2_naming_the_stage(tmp_path, llm):
    code, output, report = _check(
        tmp_path,
        "--llm-base-url",
        llm.base_url,
        "--llm-model",
        "scripted",
        "--stages",
        "judge_transfer,score-positives",
        "--limit",
        "4",
        "--min-kappa",
        "0.5",
    )
    assert code == 2
    assert (
        "error: judge-check: judge-transfer κ 0.00; score-positives κ 0.00 below --min-kappa"
        in (" ".join(output.split()))
    )
    assert [s["cases"] for s in report["stages"]] == [4, 4]  # the report is written first


def test_unknown_stage_is_one_line(tmp_path):
    code, output, _ = _check(tmp_path, "--stages", "write-queries", "--llm-base-url", "http://x")
    assert code == 2 and "--stages: write-queries not judged" in output


def test_an_endpoint_that_is_not_listening_is_one_line(tmp_path):
    code, output, report = _check(
        tmp_path, "--llm-base-url", "http://127.0.0.1:9/v1", "--stages", "score-positives"
    )
    assert code == 2 and report is None
    assert "error: cannot reach the LLM endpoint http://127.0.0.1:9/v1" in output


def test_projection_from_a_build_root_with_prices(tmp_path, gold_llm):
    (tmp_path / "build" / "mine").mkdir(parents=True)
    (tmp_path / "build" / "mine" / "_MANIFEST.json").write_text(
        json.dumps({"tables": {"pairs": {"uri": "x", "rows": 1_320}}})
    )
    code, output, report = _check(
        tmp_path,
        "--llm-base-url",
        gold_llm.base_url,
        "--llm-model",
        "scripted",
        "--stages",
        "score-positives",
        "--limit",
        "2",
        "--root",
        str(tmp_path / "build"),
        "--set",
        "llm.prices.scripted.input_per_mtok=3",
        "--set",
        "llm.prices.scripted.output_per_mtok=15",
        "--set",
        "llm.actors=4",
        "--set",
        "llm.max_in_flight=8",
    )
    assert code == 0, output
    (s,) = report["stages"]
    p, m = s["projection"], s["mean"]
    assert p["rows"] == 120 and p["concurrency"] == 32
    assert p["prompt_tokens"] == round(120 * m["prompt_tokens"])
    assert p["usd"] == round(
        120 * m["prompt_tokens"] / 1e6 * 3 + 120 * m["completion_tokens"] / 1e6 * 15, 2
    )
    assert "1,320 mined pairs" in report["rows_source"]


@pytest.mark.slow
def test_the_embedded_placeholder_is_measured(tmp_path):
    """Against the embedded llama-server (Gemma 3 270M base): any κ, but one is reported."""
    code, output, report = _check(tmp_path, "--stages", "score-positives", "--limit", "4")
    assert code == 0, output
    assert report["embedded_server"] and report["pins_ignored"]
    (s,) = report["stages"]
    assert s["cases"] == 4
    assert isinstance(s["kappa"], float) and isinstance(s["invalid_rate"], float)
    assert "κ" in output and "embedded placeholder" in output
