"""benchmarks/prompt_prefix.py: the shared-prefix share a prefix cache can reuse, over the
prompts the judges' own tasks render for the gold cases' sample texts."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_request_reuses_the_longest_prefix_it_shares_with_any_earlier_one(prompt_prefix):
    """An unbounded prefix cache: the first request reuses nothing; a later one the longest
    start it shares with any request before it, not only with all of them or the last."""
    reused = prompt_prefix.reusable_prefix(
        [[1, 2, 3, 4], [1, 2, 9], [1, 2, 3, 7], [1, 2, 9, 9], [5], [1, 2, 3, 4]]
    )
    assert reused == [0, 2, 3, 3, 0, 4]
    # at full scale: firsts of a group reuse their other prefix, the rest their group prefix
    share = prompt_prefix.projected_share([10, 10], [4, 4], [8, 6], not_first=0.5)
    assert share == pytest.approx((4 + 4 + 0.5 * (4 + 2)) / 20)


def test_every_judge_is_measured_on_the_prompts_its_task_sends(prompt_prefix):
    """The stand-in tokenizer over the prompts each task renders: the fixed instructions come
    first, so the shared prefix ends where the first row's data begins."""
    from cpr_ray.judge_check.gold import JUDGE_STAGES, load_gold
    from cpr_ray.judge_check.projection import PREFIX_SHARES
    from cpr_ray.judge_check.tasks import make_task

    report = prompt_prefix.measure(JUDGE_STAGES)
    rows = {r["stage"]: r for r in report["stages"]}
    assert list(rows) == list(JUDGE_STAGES)
    for stage, r in rows.items():
        assert r["requests"] == len(load_gold(stage)), stage
        # the runner sorts by them before any call, so they are among the inputs it checks
        assert set(make_task(stage).prefix_columns) <= set(make_task(stage).input_columns)
        assert 0 < r["prefix_tokens"] <= r["fixed_tokens"] and r["share"] <= r["ceiling"], r
        # a row's own group shares at least what every request shares, and more where the
        # task names the values its prompt opens with
        assert r["prefix_tokens"] <= r["other_prefix_tokens"] <= r["group_prefix_tokens"], r
    for stage in ("judge-analogy", "judge-transfer", "judge-negatives"):
        r = rows[stage]
        assert r["group_prefix_tokens"] > r["fixed_tokens"], r  # the query paper, the question
        assert r["groups"] < r["requests"] and r["reusable"] > r["share"], r
    assert rows["judge-analogy"]["projected"] > rows["judge-analogy"]["reusable"]
    # the projection bills what this projects (SCALE.md's table)
    assert {s: PREFIX_SHARES[s] for s in rows} == {
        s: pytest.approx(r["projected"], abs=5e-4) for s, r in rows.items()
    }
    prompts = prompt_prefix.stage_prompts("judge-transfer")
    assert len({p[:200] for p in prompts}) == 1  # the instructions, the same for every row
    assert "<data>" in prompts[0] and prompts[0].rstrip().endswith("</data>")
    assert rows["judge-analogy"]["share"] >= 0.6 and rows["dedup"]["share"] >= 0.6
