"""gold_build.py's rules, on hand-made readings: the label two readings give, when a hand
adjudication is required, the citing sentence as a build sends it, and the trim that keeps a
stage's share of real citing sentences."""

from __future__ import annotations

from typing import Any

import pytest

from cpr_ray.judge_check.gold_build import final_analogy_label, shown_context, surname, trimmed


def _r(decision: str, exclusion: str | None = None) -> dict[str, Any]:
    return {"unique_id": "CCT9", "decision": decision, "exclusion": exclusion, "why": "w"}


def test_two_rejections_take_the_exclusion_that_comes_first_in_the_methods_order():
    label = final_analogy_label(
        _r("not_analogy", "tool_or_data_as_is"), _r("not_analogy", "same_problem"), None, "USES"
    )
    assert label[:2] == ("not_analogy", "same_problem")
    assert "same_problem comes before tool_or_data_as_is" in label[2]
    agreed = final_analogy_label(_r("not_analogy", "background_only"), _r("not_analogy",
                                 "background_only"), None, "BACKGROUND")  # fmt: skip
    assert agreed == ("not_analogy", "background_only", None)


def test_a_pass_against_a_rejection_or_on_a_background_citation_needs_a_hand_adjudication():
    with pytest.raises(ValueError, match="adjudications.jsonl needs a line"):
        final_analogy_label(
            _r("observed_analogy"), _r("not_analogy", "background_only"), None, "USES"
        )
    with pytest.raises(ValueError, match="pass a BACKGROUND citation"):
        final_analogy_label(_r("observed_analogy"), _r("observed_analogy"), None, "BACKGROUND")
    hand = {"decision": "potential_analogy", "exclusion": None, "adjudication": "because"}
    assert final_analogy_label(_r("observed_analogy"), _r("not_analogy", "background_only"),
                               hand, "USES") == ("potential_analogy", None, "because")  # fmt: skip


def test_the_removed_reference_reads_as_the_cited_first_authors_name():
    assert surname('["Gary Charness", "Uri Gneezy"]') == "Charness"
    assert surname("") == "Anonymous"
    said = shown_context(
        "As noted by #AUTHOR_TAG and Gneezy (2012), the methods differ.", "Charness"
    )
    assert said == "As noted by Charness and Gneezy (2012), the methods differ."


def test_shipped_cases_without_citing_sentences_are_trimmed_to_keep_the_real_share():
    def case(i: int, kind: str, label: str) -> dict[str, Any]:
        return {"id": f"c{i}", "citing_sentence": kind, "expected": {"decision": label}}

    new = [case(i, "real", "not_analogy") for i in range(6)]
    shipped = [case(10 + i, "none", ("observed_analogy", "not_analogy")[i % 2]) for i in range(8)]
    shipped.append(case(30, "invented", "not_analogy"))
    kept = trimmed(shipped, new, "judge-analogy", 0.6)
    assert sum(c["citing_sentence"] == "real" for c in new) >= 0.6 * (len(new) + len(kept))
    assert {c["id"] for c in kept} >= {"c30"}  # invented sentences stay
    labels = [c["expected"]["decision"] for c in kept if c["citing_sentence"] == "none"]
    assert set(labels) == {"observed_analogy", "not_analogy"}  # taken from each label in turn
    assert trimmed(shipped, [], "judge-analogy", 0.6) == shipped  # nothing real: nothing trimmed
