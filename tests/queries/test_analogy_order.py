"""The analogy answer runs in the method's order (issue 44): same problem, then the mappings,
relations, type and path, then every exclusion as a test of what was mapped, then structure,
transfer and the decision. Prompt, schema, grammar and rule functions must say the same order,
and each exclusion must hold on a case of the shipped gold."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest

from cpr_ray.judge_check.gold import load_gold
from cpr_ray.queries.analogy import (
    EXCLUSIONS,
    AnalogyJudgment,
    analogy_decision,
    analogy_problems,
    analogy_record,
)
from cpr_ray.queries.judges import MAPPING, RELATION, AnalogyJudge, stated_relations
from tests.standins import scripted_llm

ORDER = list(AnalogyJudgment.model_fields)


def test_the_schema_tests_exclusions_after_mapping_and_before_deciding() -> None:
    assert ORDER[0] == "same_problem"
    mapped = ORDER.index("transfer_path")
    assert ORDER[1 : mapped + 1] == [
        "object_mappings", "shared_relations", "transfer_type", "transfer_path",
    ]  # fmt: skip
    assert ORDER[mapped + 1 : mapped + 1 + len(EXCLUSIONS)] == list(EXCLUSIONS)
    assert ORDER[mapped + 1 + len(EXCLUSIONS) :] == [
        "structural_analogy", "transfer_holds", "transferable", "reason", "decision",
    ]  # fmt: skip
    # the grammar sent to the endpoint lists the properties in the same order in every branch
    for branch in AnalogyJudgment.constrained_schema()["anyOf"]:
        assert list(branch["properties"]) == ORDER


def test_the_prompt_defines_each_field_in_the_schemas_order_and_never_looks_ahead() -> None:
    text = AnalogyJudge.prompts[0].template.split("\n<data>\n")[0]
    defined = re.findall(r"^\s*(?:\d+\.\s*)?([a-z_]+):", text, re.M)
    assert [f for f in defined if f in ORDER] == ORDER
    # nothing refers to a part of the answer not yet written ("your mappings below")
    assert not re.search(r"\b(?:mappings?|relations?|path|answer) below\b", text)


def _answer(same: bool, exclusion: str | None) -> dict[str, Any]:
    """A consistent answer that mapped the pair, then found `exclusion` in what it mapped."""
    if same:
        return scripted_llm.REJECTING | {
            "same_problem": True, "surface_similarity": False, "transfer_type": "same_problem",
        }  # fmt: skip
    return scripted_llm.ACCEPTING | {
        exclusion: True,
        "structural_analogy": False,
        "transfer_holds": False,
        "transferable": False,
        "decision": "not_analogy",
    }


def _stored(j: AnalogyJudgment) -> pa.Table:
    """The answer as the judge's output table holds it before `derive`."""
    mappings = [m.model_dump() for m in j.object_mappings]
    return pa.table(
        {
            "exclusions": pa.array([j.exclusions], pa.list_(pa.string())),
            "object_mappings": pa.array([mappings], pa.list_(MAPPING)),
            "shared_relations": pa.array([stated_relations(j)], pa.list_(RELATION)),
            "transfer_type": [j.transfer_type],
            "structural_analogy": [j.structural_analogy],
            "transfer_holds": [j.transfer_holds],
            "transferable": [j.transferable],
        }
    )


@pytest.fixture(scope="module")
def gold_exclusions() -> dict[str, str]:
    """exclusion → the id of the first shipped gold case it decides, or failing that one a reader
    decided by it. Adoption without relational transfer is only ever a reading: each case a first
    reader rejected for it was read otherwise by the second and adjudicated so."""
    out: dict[str, str] = {}
    cases = load_gold("judge-analogy")
    for case in cases:
        if case.exclusion:
            out.setdefault(case.exclusion, case.id)
    for case in cases:
        for reading in case.readings:
            if reading.exclusion:
                out.setdefault(reading.exclusion, case.id)
    return out


@pytest.mark.parametrize("exclusion", ["same_problem", *EXCLUSIONS])
def test_each_exclusion_decides_a_gold_case_and_leaves_no_mapping_on_record(
    gold_exclusions: dict[str, str], exclusion: str
) -> None:
    assert exclusion in gold_exclusions, f"no gold case is decided by {exclusion}"
    j = AnalogyJudgment.model_validate(_answer(exclusion == "same_problem", exclusion))
    assert analogy_problems(j) == []
    assert AnalogyJudgment.model_validate(j.model_dump())  # the grammar's shape
    table = _stored(j)
    assert analogy_decision(table).to_pylist() == ["not_analogy"]
    stored = analogy_record(table)
    assert stored["object_mappings"].to_pylist() == [[]]
    assert stored["shared_relations"].to_pylist() == [[]]


def test_a_passing_answer_keeps_its_mappings_on_record() -> None:
    j = AnalogyJudgment.model_validate(scripted_llm.ACCEPTING)
    stored = analogy_record(_stored(j))
    assert len(stored["object_mappings"].to_pylist()[0]) == 2
    assert len(stored["shared_relations"].to_pylist()[0]) == 1
