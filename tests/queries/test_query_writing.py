"""Query writing (B.3) and deduplication (B.4), rule by rule, without Ray or an endpoint.

The tasks' `run` is driven by a stub client that answers each answer model from a queue and
keeps every prompt, so what a regenerated step is told can be read back; the stage-level runs
against the scripted endpoint are in tests/queries/test_llm_stages.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow as pa
import pytest

from cpr_ray.config import load_config
from cpr_ray.llm.answers import check_pin, check_pins, constrained_schema
from cpr_ray.llm.client import Outcome, Usage
from cpr_ray.queries.dedup import (
    MAX_CANDIDATES,
    SameProblemJudge,
    StrongestAnalogyJudge,
    keep_strongest,
    model_choice,
    model_choices,
    strongest_answer,
    strongest_requests,
)
from cpr_ray.queries.writing import (
    PLAIN_PROSE,
    ProblemStatement,
    QueryReview,
    QueryWriter,
    WrittenQuery,
    mask_citations,
    query_rule_violations,
    taken_from_d,
)


class StubClient:
    """Answers `ask` from per-model queues (an answer model's name → outcomes, in order)."""

    def __init__(self, **queues: list[Outcome]) -> None:
        self.queues = queues
        self.asked: list[tuple[str, str, type]] = []  # (model name, prompt, answer class)

    async def ask(self, stage: str, prompt: str, answer: type, *, usage: Usage, **_: Any):
        self.asked.append((answer.__name__, prompt, answer))
        return self.queues[answer.__name__].pop(0)

    def prompts(self, name: str) -> list[str]:
        return [p for n, p, _ in self.asked if n == name]


def ok(model: type, **value: Any) -> Outcome:
    return Outcome(model(**value), "ok", None, json.dumps(value))


def run(task: Any, client: StubClient, row: dict[str, Any]) -> tuple[dict[str, Any], str, Any]:
    return asyncio.run(task.run(client, row, Usage()))


# -- citation masking ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sentence", "masked"),
    [
        ("as shown before¹² we", "as shown before[CITATION] we"),
        ("models³⁻⁵ differ", "models[CITATION] differ"),
        ("as reported.¹,³ Then", "as reported.[CITATION] Then"),
        ("as shown^12 we", "as shown[CITATION] we"),
        ("see [12–14] and [3, 5-8] and [3]", "see [CITATION] and [CITATION] and [CITATION]"),
        ("Smith et al. (2010) sampled", "[CITATION] sampled"),
        ("Smith and Lee (2010) sampled", "[CITATION] sampled"),
        ("as before (Smith et al., 2010; Li 2019).", "as before [CITATION]."),
        ("Smith (2010a) sampled", "[CITATION] sampled"),
        ("as in (e.g., Smith & Lee, 2010, 2012)", "as in [CITATION]"),
        ("van der Berg (2012) found", "[CITATION] found"),
        ("Müller et al. showed", "[CITATION] showed"),
    ],
)
def test_every_citation_form_is_masked(sentence, masked):
    assert mask_citations(sentence) == masked


@pytest.mark.parametrize(
    "sentence",
    [
        "in 2010 we used 3 layers",
        "a 10 m² plot and 5 cm³ of water at 3 s⁻¹",
        "x^2 grows like 10^6 and R² is 0.9",
        "the 2010 survey (n = 300) found 12 sites",
    ],
)
def test_numbers_years_and_powers_in_prose_are_not_masked(sentence):
    assert mask_citations(sentence) == sentence


# -- the mechanical rules ------------------------------------------------------------------------


def test_plain_words_pass_and_only_meta_language_fails():
    assert query_rule_violations("how to measure paper thickness in packaging lines?") == []
    assert query_rule_violations("how to do what the cited paper does?") == [
        "contains meta-language: the cited paper"
    ]


def test_the_rules_are_the_methods_list_and_no_more():
    """Each rule names itself; a query breaking none of the six passes."""
    broken = {
        "why do sparse signals fail?": 'must start with "How to"',
        "how to recover signals [3]?": "contains a citation marker",
        "how to recover MRI signals?": "contains an upper-case token",
        "how to transfer the mapping?": "contains meta-language: mapping",
        "how to denoise images by using diffusion?": "names a method: by using",
        "how to " + " ".join(["go"] * 44) + "?": "longer than 45 words",
    }
    for query, rule in broken.items():
        (problem,) = query_rule_violations(query)
        assert problem.startswith(rule), query


# -- what the extractor is told about d ----------------------------------------------------------

PATH = {
    "from_d": "the annealing schedule of d",
    "through_mappings": "temperature maps to the learning rate",
    "helps_q": "q trains deep networks without divergence",
}


def test_taken_from_d_is_only_the_from_d_part_of_the_path():
    assert taken_from_d(PATH) == "the annealing schedule of d"
    for empty in (None, {}, {"from_d": None, "helps_q": "q's goal"}, {"from_d": "  "}):
        assert taken_from_d(empty) == "(not stated)"
    # a one-string path of an older judgment cannot be split safely: it hands over nothing
    assert taken_from_d("The schedule comes from d. It helps q train.") == "(not stated)"


# -- the writer's steps, with a stub client ------------------------------------------------------

ROW = {
    "base_id": 1,
    "cited_id": 2,
    "q_title": "Stable training of deep networks",
    "q_abstract": "Deep networks diverge when trained with large steps.",
    "contexts": ["We follow the schedule of Smith et al. (2010) to cool the learning rate."],
    "transfer_path": PATH,
    "d_fields": "Physics, Statistical mechanics",
}
GOOD = {"problem_only": True, "grounded": True, "well_formed": True, "issue": None}


def test_prompts_carry_the_paper_and_never_q_goal_as_something_to_leave_out():
    client = StubClient(
        ProblemStatement=[ok(ProblemStatement, problem="Training diverges with large steps.")],
        WrittenQuery=[ok(WrittenQuery, query="how to train deep networks with large steps?")],
        QueryReview=[ok(QueryReview, **GOOD)],
    )
    out, status, error = run(QueryWriter(), client, ROW)
    assert (status, error, out["regenerations"]) == ("ok", None, 0)
    (extract,) = client.prompts("ProblemStatement")
    assert "the annealing schedule of d" in extract and PATH["helps_q"] not in extract
    assert "[CITATION] to cool" in extract and "Smith" not in extract
    assert "Earlier statement" not in extract and PLAIN_PROSE not in extract
    (review,) = client.prompts("QueryReview")  # grounded is checked against the paper itself
    for text in (ROW["q_title"], ROW["q_abstract"], "[CITATION] to cool", "large steps?"):
        assert text in review


def test_a_retry_gets_the_earlier_problem_and_the_objection():
    client = StubClient(
        ProblemStatement=[
            ok(ProblemStatement, problem="Training diverges on GPUs with large steps."),
            ok(ProblemStatement, problem="Training diverges with large steps."),
        ],
        WrittenQuery=[
            ok(WrittenQuery, query="how to train deep networks on many devices with large steps?"),
            ok(WrittenQuery, query="how to train deep networks with large steps?"),
        ],
        QueryReview=[
            ok(QueryReview, **(GOOD | {"grounded": False, "issue": "the paper names no devices"})),
            ok(QueryReview, **GOOD),
        ],
    )
    out, status, _ = run(QueryWriter(), client, ROW)
    assert status == "ok" and out["regenerations"] == 1
    assert out["written_query"] == "how to train deep networks with large steps?"
    first, second = client.prompts("ProblemStatement")
    assert "Earlier statement" not in first
    assert "Earlier statement (rejected): Training diverges on GPUs with large steps." in second
    assert "Objection: the paper names no devices" in second and PLAIN_PROSE in second
    _, rewrite = client.prompts("WrittenQuery")
    assert "Earlier question (rejected): how to train deep networks on many devices" in rewrite
    assert "Objection: the paper names no devices" in rewrite
    assert "stays in the new question" in rewrite  # the defining conditions are kept


def _refused(raw: str) -> Outcome:
    error = "the answer does not match the required fields (query: String should match pattern)"
    return Outcome(None, "invalid", error, raw)


def test_a_query_the_schema_refuses_is_regenerated_with_the_rule_it_broke():
    client = StubClient(
        ProblemStatement=[ok(ProblemStatement, problem="Training diverges.")] * 2,
        WrittenQuery=[
            _refused('{"query": "How to train networks [3]."}'),
            ok(WrittenQuery, query="how to train deep networks with large steps?"),
        ],
        QueryReview=[ok(QueryReview, **GOOD)],
    )
    out, status, error = run(QueryWriter(), client, ROW)
    assert (status, error, out["regenerations"], out["form_issue"]) == ("ok", None, 1, None)
    assert len(client.prompts("QueryReview")) == 1  # the refused question was never reviewed
    _, rewrite = client.prompts("WrittenQuery")
    assert "Earlier question (rejected): How to train networks [3]." in rewrite
    assert 'ending in its only "?"' in rewrite and "'['" in rewrite
    assert "contains a citation marker" in rewrite


def test_a_query_refused_every_time_drops_the_pair_with_its_reason_not_a_failure():
    client = StubClient(
        ProblemStatement=[ok(ProblemStatement, problem="Training diverges.")] * 3,
        WrittenQuery=[_refused('{"query": "How to train networks [3]."}')] * 2
        + [_refused("Sorry, no JSON here")],
    )
    out, status, error = run(QueryWriter(), client, ROW)
    assert (status, error, out["regenerations"]) == ("ok", None, 2)
    assert out["written_query"] is None and "no readable question" in out["form_issue"]
    table = pa.Table.from_pylist(
        [{**out, "status": status}],
        schema=QueryWriter.output_schema.append(pa.field("status", pa.string())),
    )
    derived = QueryWriter().derive(table)
    assert derived["query"].to_pylist() == [None]
    assert "no readable question" in derived["drop_reason"][0].as_py()


def test_a_transport_failure_of_the_rewrite_is_still_a_failure():
    client = StubClient(
        ProblemStatement=[ok(ProblemStatement, problem="Training diverges.")],
        WrittenQuery=[Outcome(None, "failed", "gave up after 3 attempts: HTTP 500", None)],
    )
    _, status, error = run(QueryWriter(), client, ROW)
    assert status == "failed" and error.startswith("query rewrite: gave up")


# -- dedup: the model chooses the strongest analogy, the ranking breaks ties ---------------------


def _query(base: int, cited: int, **kw: Any) -> dict[str, Any]:
    return {
        "base_id": base,
        "cited_id": cited,
        "query": f"how to do task {base}?",
        "q_title": f"Paper {base}",
        "q_abstract": f"Abstract of paper {base}.",
        "d_title": f"Cited {cited}",
        "d_abstract": f"Abstract of cited {cited}.",
        "contexts": [f"We adopt the model of [{cited}]."],
        "object_mappings": [{"q_object": "load", "d_object": "heat", "role": "flows"}],
        "shared_relations": [],
        "decision": "potential_analogy",
        "transfer_type": "method",
        **kw,
    }


# base 1: 11, 12, 13 one problem (the ranking prefers 12, observed); base 2: 21 alone, 22 and 23
QUERIES = pa.Table.from_pylist(
    [
        _query(1, 11),
        _query(1, 12, decision="observed_analogy"),
        _query(1, 13),
        _query(2, 21),
        _query(2, 22),
        _query(2, 23, decision="observed_analogy"),
    ]
)
SAME = [(1, 11, 12), (1, 12, 13), (2, 22, 23)]


def _kept(table: pa.Table) -> dict[int, str]:
    return {r["cited_id"]: r["dedup_chosen_by"] for r in table.to_pylist() if r["kept"]}


def test_the_models_choice_overrides_the_ranking():
    deduped = keep_strongest(QUERIES, SAME, {(1, 11): 13, (2, 22): 22})
    assert _kept(deduped) == {13: "model", 21: "alone", 22: "model"}
    assert deduped["dedup_group"].to_pylist() == [11, 11, 11, 21, 22, 22]


def test_without_a_valid_choice_the_ranking_decides():
    assert _kept(keep_strongest(QUERIES, SAME)) == {12: "rule", 21: "alone", 23: "rule"}
    # a choice that is not a member of its group is no choice
    assert _kept(keep_strongest(QUERIES, SAME, {(1, 11): 23})) == {
        12: "rule", 21: "alone", 23: "rule",
    }  # fmt: skip


def test_an_answer_naming_no_candidate_or_invalid_falls_back():
    candidates = [{"cited_id": 11}, {"cited_id": 12}, {"cited_id": 13}]
    assert model_choice(3, candidates) == 13
    assert [model_choice(i, candidates) for i in (0, 4, None)] == [None, None, None]
    judged = pa.Table.from_pylist(
        [
            {"base_id": 1, "dedup_group": 11, "candidates": candidates, "status": status,
             "strongest_index": index, "strongest_reason": None}
            for status, index in (("ok", 2), ("ok", 9), ("invalid", None), ("failed", None))
        ]
    )  # fmt: skip
    derived = StrongestAnalogyJudge().derive(judged)
    assert derived["model_choice"].to_pylist() == [12, None, None, None]
    assert model_choices(derived.slice(1)) == {}  # every group falls back to the ranking
    assert model_choices(derived) == {(1, 11): 12}


def test_one_request_per_group_of_two_or_more_in_cited_order():
    requests = strongest_requests(QUERIES, SAME)
    assert requests.select(["base_id", "dedup_group"]).to_pylist() == [
        {"base_id": 1, "dedup_group": 11},
        {"base_id": 2, "dedup_group": 22},
    ]
    first = requests.to_pylist()[0]["candidates"]
    assert [c["cited_id"] for c in first] == [11, 12, 13]
    assert first[0]["mappings"] == "load -> heat (flows)"
    big = pa.Table.from_pylist([_query(3, 100 + i) for i in range(MAX_CANDIDATES + 2)])
    links = [(3, 100, 100 + i) for i in range(1, MAX_CANDIDATES + 2)]
    (row,) = strongest_requests(big, links).to_pylist()
    assert len(row["candidates"]) == MAX_CANDIDATES


def test_the_strongest_prompt_shows_every_candidate_and_the_schema_bounds_the_index():
    (row,) = strongest_requests(QUERIES, SAME).slice(0, 1).to_pylist()
    client = StubClient(StrongestAnalogy=[ok(strongest_answer(3), index=2, reason="its method")])
    out, status, _ = run(StrongestAnalogyJudge(), client, row)
    assert (out, status) == ({"strongest_index": 2, "strongest_reason": "its method"}, "ok")
    ((_, prompt, answer),) = client.asked
    assert "Citing paper's title: Paper 1" in prompt and "Abstract of paper 1." in prompt
    for cited in (11, 12, 13):
        assert f"Cited title: Cited {cited}" in prompt and f"Abstract of cited {cited}." in prompt
    assert "We adopt the model of [CITATION]." in prompt and "load -> heat (flows)" in prompt
    assert "Candidate 3" in prompt and "from 1 to 3" in prompt and "Candidate 4" not in prompt
    index = constrained_schema(answer)["properties"]["index"]
    assert (index["minimum"], index["maximum"]) == (1, 3)
    with pytest.raises(ValueError):
        strongest_answer(1)


def test_the_dry_runs_same_problem_pin_still_holds_with_the_strongest_answer():
    strongest_answer(2)  # loaded, as in a build
    check_pin({"same_problem": False})
    check_pins(load_config("dry-run", env={}).llm, ["dedup"])
    assert "same_problem" not in json.dumps(constrained_schema(strongest_answer(2)))
    assert SameProblemJudge.prompts[0].id == "dedup.v3"
    # the method's test, not a narrower one: the same problem in another setting is the same
    template = " ".join(SameProblemJudge.prompts[0].template.split())
    assert "would a paper that answers one of them also answer the other?" in template
    assert "another dataset, population, language or setting" in template
    assert "a condition that one question needs and the other does not" not in template
