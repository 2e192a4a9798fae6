"""benchmarks/prompt_prefix.py: the shared-prefix share a prefix cache can reuse, over the
prompts the judges' own tasks render for the gold cases' sample texts."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prompt_prefix():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module("prompt_prefix")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_share_is_the_prefix_every_request_shares_over_the_mean_prompt(prompt_prefix):
    words = lambda text: [hash(w) for w in text.split()]  # noqa: E731
    prompts = [
        "rules one two three <data> paper a </data>",  # 8 tokens, the first 5 shared
        "rules one two three <data> paper b b b </data>",  # 10
        "rules one two three <data> </data>",  # 6
    ]
    r = prompt_prefix.prefix_share(prompts, words, fixed_tokens=6)
    assert (r["requests"], r["mean_tokens"], r["prefix_tokens"]) == (3, 8.0, 5)
    assert r["share"] == pytest.approx(5 / 8)
    assert r["vs_goal"] == pytest.approx(5 / 8 / 0.6, abs=1e-3)
    assert r["ceiling"] == pytest.approx(6 / 8)
    # a row-specific word first leaves nothing to share; one prompt shares all of itself
    assert prompt_prefix.shared_prefix([[1, 2, 3], [9, 2, 3]]) == 0
    assert prompt_prefix.shared_prefix([[1, 2, 3]]) == 3
    assert prompt_prefix.shared_prefix([[1, 2], [1, 2, 3]]) == 2
    assert prompt_prefix.prefix_share([], words)["requests"] == 0


def test_every_judge_is_measured_on_the_prompts_its_task_sends(prompt_prefix):
    """The stand-in tokenizer over the prompts each task renders: the fixed instructions come
    first, so the shared prefix ends where the first row's data begins."""
    from cpr_ray.judge_check.gold import JUDGE_STAGES, load_gold

    report = prompt_prefix.measure(JUDGE_STAGES)
    rows = {r["stage"]: r for r in report["stages"]}
    assert list(rows) == list(JUDGE_STAGES)
    for stage, r in rows.items():
        assert r["requests"] == len(load_gold(stage)), stage
        assert 0 < r["prefix_tokens"] <= r["fixed_tokens"] and r["share"] <= r["ceiling"], r
    prompts = prompt_prefix.stage_prompts("judge-transfer")
    assert len({p[:200] for p in prompts}) == 1  # the instructions, the same for every row
    assert "<data>" in prompts[0] and prompts[0].rstrip().endswith("</data>")
    assert rows["judge-analogy"]["share"] >= 0.6 and rows["dedup"]["share"] >= 0.6
