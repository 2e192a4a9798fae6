"""The constrained schemas sent to the endpoint say the decision rules JSON Schema can say.

Checked with `jsonschema` against the same answers the rule checks judge: every answer the rules
accept fits the schema, every answer they reject for a rule a schema can express does not, and the
rules a schema cannot express (an argument must be a mapped object, no meta-language or method
phrases in a query) are listed as what only the checks after arrival catch.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ValidationError

from cpr_ray.config import LLMConfig, load_config
from cpr_ray.errors import ConfigError
from cpr_ray.evaluate import rewriters
from cpr_ray.llm import answers
from cpr_ray.llm.answers import constrained_schema
from cpr_ray.llm.client import parse_answer, response_format
from cpr_ray.pipeline.build import preflight
from cpr_ray.queries import analogy, dedup, synthesis, usefulness, writing
from cpr_ray.queries.analogy import (
    AnalogyJudgment,
    TransferVerdict,
    analogy_problems,
    transfer_problems,
)
from cpr_ray.queries.judges import AnalogyJudge
from cpr_ray.queries.usefulness import Usefulness
from cpr_ray.queries.writing import WrittenQuery, query_rule_violations
from cpr_ray.retrieval import llm_judge
from cpr_ray.storage.store import Storage
from tests.standins import scripted_llm

ANSWER_MODELS: list[type[BaseModel]] = [
    m
    for module in (analogy, writing, dedup, usefulness, synthesis, llm_judge, rewriters)
    for m in vars(module).values()
    if isinstance(m, type)
    and issubclass(m, answers._Answer)
    and m is not answers._Answer
    and m.__module__ == module.__name__
]


def fits(model: type[BaseModel], value: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(constrained_schema(model)).is_valid(value)


def parses(model: type[BaseModel], value: dict[str, Any]) -> BaseModel | None:
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def test_every_answer_model_has_a_valid_schema_that_fits_the_scripted_answers():
    prompt = "\n".join(  # the lines the scripted endpoint reads its answers from
        [
            "Q title: diffusion models",
            "Title: Sampling images",
            "Problem: The difficulty of recovering sparse signals from few sensors.",
            "Question A: how to recover sparse signals?",
            "Question B: how to recover sparse signals from noise?",
            "Question: how to recover sparse signals?",
            "Passage: a passage",
            "Paper: a useful paper",
            "pick the 2 most useful",
            "[a] a useful one",
            "[b] another",
        ]
    )
    assert {m.__name__ for m in ANSWER_MODELS} >= set(scripted_llm.ANSWERS) - {"unknown"}
    for model in ANSWER_MODELS:
        schema = constrained_schema(model)
        jsonschema.Draft202012Validator.check_schema(schema)
        json.dumps(schema)  # plain JSON: what goes over the wire
        if model.__name__ in scripted_llm.ANSWERS:
            answer = scripted_llm.ANSWERS[model.__name__](prompt)
            assert fits(model, answer), (model.__name__, answer)


def _schemas_of(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The object schemas an answer of `model` (or a model it nests) may fit, one per branch."""
    schema = constrained_schema(model)
    out = []
    for node in [schema, *schema.get("$defs", {}).values()]:
        out.extend(node.get("anyOf", [node]))
    return out


@pytest.mark.parametrize("model", ANSWER_MODELS, ids=lambda m: m.__name__)
def test_bounds_of_the_models_are_in_every_branch(model):
    """maxLength, maxItems and integer bounds are the model's own: a branch may narrow a list,
    never widen it, and where no branch narrows a field its bound is exactly the model's."""
    by_name = {m.__name__: m for m in [model, *answers._nested_answers(model)]}
    widest: dict[tuple[str, str], int] = {}
    for obj in _schemas_of(model):
        fields = by_name[obj["title"]].model_fields
        for name, prop in obj["properties"].items():
            if "const" in prop or "enum" in prop:
                continue
            bounds = {type(c).__name__: c for c in fields[name].metadata}
            if "MaxLen" in bounds:
                options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
                # a list's alternatives (relation arguments) are arrays each, a string is not
                keys = ["maxItems" if o.get("type") == "array" else "maxLength" for o in options]
                sizes = [o[key] for o, key in zip(options, keys, strict=True)]
                assert all(size <= bounds["MaxLen"].max_length for size in sizes), name
                seen = widest.get((obj["title"], name), 0)
                widest[(obj["title"], name)] = max(seen, *sizes)
            if "Ge" in bounds:
                assert prop["minimum"] == bounds["Ge"].ge and prop["type"] == "integer"
            if "Le" in bounds:
                assert prop["maximum"] == bounds["Le"].le
    for (title, name), bound in widest.items():
        meta = {type(c).__name__: c for c in by_name[title].model_fields[name].metadata}
        assert bound == meta["MaxLen"].max_length, (title, name)


# -- the analogy judgment ------------------------------------------------------------------------

MAPPINGS = [
    {"q_object": "data distribution", "d_object": "initial state", "role": "start"},
    {"q_object": "noise distribution", "d_object": "equilibrium state", "role": "end"},
    {"q_object": "sampler", "d_object": "reverse process", "role": "path"},
]


# map, then falsify: a judge that maps first and then finds the mappings off Q's goal writes
# them, then decides not_analogy with nothing holding (the stored record drops them)
FALSIFIED = scripted_llm.ACCEPTING | {
    "off_goal_mapping": True,
    "structural_analogy": False,
    "transfer_holds": False,
    "transferable": False,
    "decision": "not_analogy",
}


def _relations(n: int) -> list[dict[str, Any]]:
    """n shared relations over the first two mappings (grounded when they exist)."""
    return [{"predicate": f"Converts{i}", "arguments": [1, 2]} for i in range(n)]


def _judgment(
    same: bool,
    excluded: str | None,
    kind: str,
    mappings: int,
    relations: int,
    structural: bool,
    holds: bool,
    able: bool,
    d: str,
) -> dict[str, Any]:
    return {
        "same_problem": same,
        **scripted_llm.NO_EXCLUSION,
        **({excluded: True} if excluded else {}),
        "object_mappings": MAPPINGS[:mappings],
        "shared_relations": _relations(relations),
        "structural_analogy": structural,
        "transfer_holds": holds,
        "transferable": able,
        "transfer_type": kind,
        "transfer_path": {"from_d": "the process", "through_mappings": "m", "helps_q": "h"},
        "reason": "r",
        "decision": d,
    }


ALL_JUDGMENTS = [  # relations need two mappings to be grounded: the schema's blind spot
    _judgment(same, excluded, kind, m, r, *rest)
    for same, excluded, kind, m, r, *rest in itertools.product(
        (False, True),
        (None, "surface_similarity", "off_goal_mapping"),  # none, or one of two exclusions
        ("method", "none", "same_problem"),
        (0, 1, 2, 3),
        (0, 1, 2),
        (False, True),
        (False, True),
        (False, True),
        ("observed_analogy", "potential_analogy", "not_analogy"),
    )
    if m >= 2 or not r
]


def test_the_analogy_schema_accepts_exactly_the_consistent_judgments():
    """Every combination of same problem, an exclusion (one that needs no mapping, one that
    judges them), transfer type, booleans, decision and list sizes (with grounded relations):
    the schema and the rule checks agree on each one."""
    consistent = 0
    for value in ALL_JUDGMENTS:
        problems = analogy_problems(AnalogyJudgment.model_validate(value))
        assert fits(AnalogyJudgment, value) == (not problems), (problems, value)
        consistent += not problems
    # same problem (type same_problem, nothing mapped): 3 (with no other exclusion or either);
    # an exclusion (each tests what was mapped): 2 exclusions x 2 types (method, none) x 8 list
    # sizes, nothing holding; no exclusion and no structural analogy: 2 types x 8 list sizes x 3
    # (holds, transferable); a structural analogy: 4 list sizes x (observed and potential with
    # a contribution, not_analogy with either type)
    assert (consistent, len(ALL_JUDGMENTS)) == (3 + 32 + 48 + 16, 3456)


@pytest.mark.parametrize(
    "value",
    [
        scripted_llm.ACCEPTING,
        scripted_llm.REJECTING,
        scripted_llm.analogy("Q title: SAME task"),
        scripted_llm.ACCEPTING | {"decision": "potential_analogy", "transfer_holds": False},
        FALSIFIED,
    ],
    ids=["observed", "not-analogy", "same-problem", "potential", "falsified-after-mapping"],
)
def test_the_scripted_judgments_the_rules_accept_fit(value):
    assert analogy_problems(AnalogyJudgment.model_validate(value)) == []
    assert fits(AnalogyJudgment, value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (scripted_llm.ACCEPTING | {"decision": "not_analogy"}, "contradicts the rest"),
        (scripted_llm.ACCEPTING | {"transferable": False}, "so transferable must be true"),
        (scripted_llm.ACCEPTING | {"same_problem": True}, "same_problem is true"),
        (  # tests/llm/test_llm_decisions.py: a structural analogy without mappings
            _judgment(False, None, "method", 0, 0, True, False, True, "potential_analogy"),
            "at least two mappings",
        ),
        (scripted_llm.ACCEPTING | {"off_goal_mapping": True}, "structural_analogy, transfer"),
        (scripted_llm.ACCEPTING | {"background_only": True}, "structural_analogy, transfer"),
        (scripted_llm.ACCEPTING | {"transfer_type": "tool_as_is"}, "contribution of D"),
        (scripted_llm.ACCEPTING | {"transfer_type": "same_problem"}, "exactly when same_problem"),
    ],
    ids=[
        "decision",
        "holds-not-transferable",
        "same-problem",
        "no-mappings",
        "off-goal-yet-holding",
        "background-yet-holding",
        "no-contribution",
        "same-problem-type",
    ],
)
def test_judgments_the_rules_reject_do_not_fit(value, problem):
    assert problem in "; ".join(analogy_problems(AnalogyJudgment.model_validate(value)))
    assert not fits(AnalogyJudgment, value)


@pytest.mark.parametrize(
    "arguments", [[1], [], [1, 2, 3, 4], [0, 1], [1, 9], [1, 1], [2, 1, 2], [1, 2, 2]]
)
def test_a_relation_holds_over_two_or_three_mapping_numbers(arguments):
    """A property of one object is not a relation, nor is a predicate naming one mapping twice
    ([1, 1]); an argument is a mapping's number."""
    value = scripted_llm.ACCEPTING | {
        "shared_relations": [{"predicate": "P", "arguments": arguments}]
    }
    assert not fits(AnalogyJudgment, value) and parses(AnalogyJudgment, value) is None


def test_every_ordered_choice_of_distinct_mappings_fits_and_a_repeat_is_sent_back():
    """The constrained form spells distinctness out (no grammar enforces uniqueItems) and leaves
    no relation out; the plain form keeps the short list schema; a repeated mapping that reaches
    the contract (a plain-form endpoint) is refused with the rule, which the re-ask quotes."""
    mappings = [{"q_object": f"q{i}", "d_object": f"d{i}", "role": "r"} for i in range(1, 9)]
    for n in (2, 3):
        for arguments in itertools.permutations(range(1, 9), n):
            value = scripted_llm.ACCEPTING | {
                "object_mappings": mappings,
                "shared_relations": [{"predicate": "P", "arguments": list(arguments)}],
            }
            assert fits(AnalogyJudgment, value), arguments
    plain = AnalogyJudgment.model_json_schema()["$defs"]["SharedRelation"]["properties"]
    assert plain["arguments"]["type"] == "array" and "anyOf" not in plain["arguments"]
    repeated = scripted_llm.ACCEPTING | {
        "shared_relations": [{"predicate": "P", "arguments": [1, 1]}]
    }
    value, problem = parse_answer(json.dumps(repeated), AnalogyJudgment)
    assert value is None and "distinct mappings: [1, 1] names one mapping twice" in problem


def test_an_ungrounded_relation_is_only_caught_after_arrival():
    """A schema bounds a mapping's number, not by how many mappings the answer gave."""
    value = scripted_llm.ACCEPTING | {"shared_relations": [{"predicate": "P", "arguments": [1, 5]}]}
    assert fits(AnalogyJudgment, value)
    problems = analogy_problems(AnalogyJudgment.model_validate(value))
    assert "names mapping(s) [5], but 2 were given" in problems[0]


def test_the_stored_relations_read_the_numbered_mappings_on_each_side():
    from cpr_ray.queries.judges import format_relations, stated_relations

    judged = AnalogyJudgment.model_validate(scripted_llm.ACCEPTING)
    assert format_relations(stated_relations(judged)) == (
        "Converts(data distribution, noise distribution) ~ "
        "Converts(initial state, equilibrium state)"
    )


# -- the transfer verdict ------------------------------------------------------------------------


@pytest.mark.parametrize("verdict", ["transfer", "reject"])
@pytest.mark.parametrize(
    "reason", [None, "same_problem", "background_only", "unsupported_mappings"]
)
def test_the_transfer_schema_accepts_exactly_the_consistent_verdicts(verdict, reason):
    value = {"verdict": verdict, "reject_reason": reason, "reason": "r"}
    assert fits(TransferVerdict, value) == (
        transfer_problems(TransferVerdict.model_validate(value)) == []
    )
    assert not fits(TransferVerdict, value | {"reject_reason": "bored"})


# -- the written query ---------------------------------------------------------------------------

ACCEPTED_QUERIES = [
    "How to recover sparse signals from few sensors?",  # tests/llm/test_llm_decisions.py
    "how to keep a sensor network alive on harvested energy?",
    "how to estimate crop yield from sparse field samples?",
    "How to schedule radios, given a duty cycle of 10 percent?",
    "how to " + " ".join(["word"] * 43) + "?",  # 45 words
    # "paper", "citation" and "analogous" are ordinary words; only meta phrases are banned
    "how to measure paper thickness in packaging lines?",
    "how to predict the citation counts of new articles?",
    "how to build analogous circuits at low power?",
    "how to forecast demand in 2010 prices with 3 layers of suppliers?",
]
REJECTED_QUERIES = {  # rules a pattern can say
    "Why do sparse signals fail?": 'start with "How to"',
    "how to recover sparse signals [3]?": "citation marker",
    "how to recover sparse signals [CITATION] from sensors?": "citation marker",
    "How to model queues (Smith et al. 2010)?": "citation marker",
    "How to recover MRI signals?": "upper-case token",
    "how to " + " ".join(["word"] * 44) + "?": "longer than 45 words",
}
ONLY_AFTER_ARRIVAL = {  # rules about words a pattern without look-ahead cannot exclude
    "How to use the cited paper?": "meta-language",
    "how to do what the cited paper does?": "meta-language: the cited paper",
    "how to solve the problem of this paper?": "meta-language: this paper",
    "how to find the citation?": "meta-language: the citation",
    "how to do something analogous to the cited method?": "meta-language: the cited method",
    "how to transfer the analogy to networks?": "meta-language: analogy",
    "how to keep the mappings between graphs?": "meta-language: mappings",
    "how to model queues as in smith (2010)?": "citation marker",
    "how to denoise images via diffusion?": "names a method: via",
    "how to denoise images by using diffusion?": "names a method",
}


@pytest.mark.parametrize("query", ACCEPTED_QUERIES)
def test_queries_the_rules_accept_fit(query):
    assert query_rule_violations(query) == []
    assert parses(WrittenQuery, {"query": query}) is not None
    assert fits(WrittenQuery, {"query": query})


@pytest.mark.parametrize(("query", "rule"), REJECTED_QUERIES.items())
def test_queries_the_rules_reject_do_not_fit(query, rule):
    assert rule in "; ".join(query_rule_violations(query))
    assert not fits(WrittenQuery, {"query": query})
    assert parses(WrittenQuery, {"query": query}) is None  # the model validates the same form


@pytest.mark.parametrize(("query", "rule"), ONLY_AFTER_ARRIVAL.items())
def test_meta_language_and_method_phrases_are_caught_after_arrival(query, rule):
    assert fits(WrittenQuery, {"query": query})
    assert rule in "; ".join(query_rule_violations(query))


@pytest.mark.parametrize(
    "query",
    ["how to go?\nhow to stop?", "how to  go?", "how to go? ", "how to go. then stop?", "how to?"],
)
def test_one_single_spaced_question_only(query):
    assert not fits(WrittenQuery, {"query": query})
    assert parses(WrittenQuery, {"query": query}) is None


def test_the_word_bound_lives_in_the_pattern_the_grammar_enforces():
    """llama.cpp's grammar ignores maxLength beside a pattern: the pattern bounds the words."""
    prop = constrained_schema(WrittenQuery)["properties"]["query"]
    assert prop["maxLength"] == writing.QUERY_CHARS
    words = re.search(r"\{1,(\d+)\}\\\?\$$", prop["pattern"])
    assert words and int(words.group(1)) + 2 == writing.MAX_QUERY_WORDS


# -- scores --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "low", "high"), [(Usefulness, 0, 3), (llm_judge.Score, 0, 10)])
def test_scores_are_bounded_integers(model, low, high):
    for score in range(low - 2, high + 3):
        value = {"score": score}
        assert fits(model, value) == (low <= score <= high) == (parses(model, value) is not None)
    assert not fits(model, {"score": "2"}) and not fits(model, {"score": 1.5})
    # the method's grader writes no reasoning: the score is the whole answer
    assert list(constrained_schema(Usefulness)["properties"]) == ["score"]


# -- the request ---------------------------------------------------------------------------------


def test_response_format_per_endpoint_form():
    forms = LLMConfig.model_fields["response_format"].annotation.__args__
    assert forms == ("json_schema", "json_schema_plain", "json_object_schema")
    assert LLMConfig().response_format == "json_schema"
    constrained = response_format(AnalogyJudgment, "json_schema")
    assert constrained["type"] == "json_schema"
    assert constrained["json_schema"]["name"] == "AnalogyJudgment"
    # same problem; an exclusion found in what was mapped; no structural analogy (2); a
    # structural analogy (3)
    assert len(constrained["json_schema"]["schema"]["anyOf"]) == 7
    plain = response_format(AnalogyJudgment, "json_schema_plain")["json_schema"]["schema"]
    assert plain == AnalogyJudgment.model_json_schema() and "anyOf" not in plain
    legacy = response_format(AnalogyJudgment, "json_object_schema")
    assert legacy == {"type": "json_object", "schema": AnalogyJudgment.model_json_schema()}
    # models without branches send their own schema either way
    assert response_format(Usefulness, "json_schema")["json_schema"]["schema"] == (
        Usefulness.model_json_schema()
    )


# -- pinned answers (the dry run's placeholder judge) --------------------------------------------


def _fits_pinned(model: type[BaseModel], pin: dict[str, Any], value: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(constrained_schema(model, pin)).is_valid(value)


def test_a_pinned_decision_keeps_only_the_branches_that_allow_it():
    pin = {"decision": "observed_analogy"}
    observed = [v for v in ALL_JUDGMENTS if fits(AnalogyJudgment, v)]
    for value in observed:  # among consistent answers, exactly the observed ones fit
        assert _fits_pinned(AnalogyJudgment, pin, value) == (
            value["decision"] == "observed_analogy"
        )
    assert any(v["decision"] == "observed_analogy" for v in observed)
    # the rules a schema can say still hold under the pin
    assert not _fits_pinned(AnalogyJudgment, pin, scripted_llm.ACCEPTING | {"same_problem": True})
    assert _fits_pinned(AnalogyJudgment, pin, scripted_llm.ACCEPTING)


def test_pins_on_models_without_branches_and_per_model():
    assert _fits_pinned(Usefulness, {"score": 3}, {"reasoning": "r", "score": 3})
    assert not _fits_pinned(Usefulness, {"score": 3}, {"reasoning": "r", "score": 2})
    # a stage's pin reaches only the answer models holding the field (write-queries asks three)
    assert constrained_schema(WrittenQuery, {"grounded": True}) == constrained_schema(WrittenQuery)
    verdict = constrained_schema(TransferVerdict, {"verdict": "transfer"})
    assert "anyOf" not in verdict and verdict["properties"]["reject_reason"] == {
        "title": "Reject Reason",
        "const": None,
    }


@pytest.mark.parametrize(
    ("pin", "error"),
    [
        ({"decisoin": "observed_analogy"}, "no answer has field(s) decisoin to pin"),
        (
            {"same_problem": True, "decision": "observed_analogy"},
            "leaves no consistent AnalogyJudgment answer",
        ),
        ({"verdict": "maybe"}, "leaves no consistent TransferVerdict answer"),
    ],
)
def test_a_bad_pin_is_a_config_error_before_any_work(pin, error, tmp_path):
    """The settings tree knows no answer contracts: the LLM layer checks pins, before a build
    starts Ray (its preflight) and before any stage asks."""
    cfg = load_config(
        "dry-run",
        overrides=[
            f"storage.root={tmp_path}",
            f"llm.stages.judge-analogy.pin={json.dumps(pin)}",
        ],
    )
    message = re.escape("invalid config: llm.stages.judge-analogy.pin: ") + ".*" + re.escape(error)
    with pytest.raises(ConfigError, match=message):
        answers.check_pins(cfg.llm)
    with pytest.raises(ConfigError, match=message):
        preflight(cfg, Storage(cfg.storage), ["mine"])


def test_pins_need_the_constrained_form():
    pin = 'llm.stages.judge-transfer.pin={"verdict": "transfer"}'
    with pytest.raises(ConfigError, match="only the constrained schema can carry"):
        load_config(overrides=[pin, "llm.response_format=json_schema_plain"])
    llm = load_config("dry-run").llm
    assert llm.pin_for("judge_transfer") == {"verdict": "transfer"}


def test_a_pinned_answer_is_cached_apart_and_unpinned_keys_do_not_change():
    task = AnalogyJudge()
    row = {c: "x" for c in task.key_columns}
    plain = task.request_key("m", row)
    assert task.request_key("m", row, {}) == plain
    assert task.request_key("m", row, {"decision": "observed_analogy"}) != plain


def test_the_pinned_schema_goes_over_the_wire():
    pinned = response_format(Usefulness, "json_schema", (("score", 0),))["json_schema"]["schema"]
    assert pinned["properties"]["score"]["const"] == 0


def test_each_kind_of_synthesized_query_opens_its_own_way():
    """The six queries of one answer cannot be the same string: no kind's pattern admits
    another kind's query, and each is bounded to the word limit."""
    from cpr_ray.queries.synthesis import KIND_PATTERNS, DiverseQueries
    from cpr_ray.queries.writing import MAX_QUERY_WORDS

    answer = scripted_llm.diverse_queries("Title: Crystal growth under pressure")
    assert fits(DiverseQueries, answer)
    for kind, query in answer.items():
        matching = [k for k, p in KIND_PATTERNS.items() if re.fullmatch(p, query)]
        assert matching == [kind], (kind, query, matching)
    too_long = "What " + " ".join(["word"] * MAX_QUERY_WORDS) + "?"
    assert not re.fullmatch(KIND_PATTERNS["factual"], too_long)
