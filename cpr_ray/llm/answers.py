"""The answer contracts of every LLM step (paper App. B), and the rules answers must obey.

The enums, fields and scales are the contract; prompts only explain them. Consistency rules are
enforced in code (`*_problems` return what is wrong, for a re-ask), so a model cannot answer in
contradiction with them. Decisions (`analogy_decision`, `analogy_passed`, `transfer_verified`,
`query_objections`) are pure functions of the answers, applied after every cache read: the cache
keeps what the model said, and a changed rule reaches old answers without a call. A model that
obeys injected text *consistently* passes these checks; that is caught on the inputs instead
(`cpr_ray/llm/injection.py`).
"""

from __future__ import annotations

import re
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

TransferType = Literal[
    "method",
    "problem_formulation",
    "evaluation_design",
    "data_construction",
    "finding_or_evidence",
    "narrative_only",
    "tool_as_is",
    "same_problem",
    "none",
]
Decision = Literal["observed_analogy", "potential_analogy", "not_analogy"]
PASSING: tuple[Decision, ...] = ("observed_analogy", "potential_analogy")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ObjectMapping(_Answer):
    q_object: str = Field(max_length=80, description="An object of the citing paper's problem.")
    d_object: str = Field(
        max_length=80, description="The object of the cited paper playing the same role."
    )
    role: str = Field(max_length=120, description="The role both objects play.")


class SharedRelation(_Answer):
    predicate: str = Field(
        max_length=60, description="A relation holding on both sides, e.g. Converts."
    )
    q_arguments: list[str] = Field(
        max_length=4, description="Its arguments among the mapped q objects."
    )
    d_arguments: list[str] = Field(
        max_length=4, description="The mapped d objects, in the same order."
    )


class AnalogyJudgment(_Answer):
    same_problem: bool
    object_mappings: list[ObjectMapping] = Field(max_length=8)
    shared_relations: list[SharedRelation] = Field(max_length=6)
    structural_analogy: bool
    transfer_holds: bool
    transferable: bool
    transfer_type: TransferType
    transfer_path: str = Field(max_length=600)
    reason: str = Field(max_length=400)
    decision: Decision


def analogy_decision(answers: pa.Table) -> pa.ChunkedArray:
    """The decision the booleans imply: the only decision the pipeline ever acts on.

    Over a table of answers (`structural_analogy`, `transfer_holds`, `transferable`), so it runs
    after every cache read and a changed rule reaches old answers; null where there is no answer.
    """
    structural = answers["structural_analogy"]
    observed = pc.and_(structural, answers["transfer_holds"])
    potential = pc.and_(structural, answers["transferable"])
    return pc.if_else(
        observed, "observed_analogy", pc.if_else(potential, "potential_analogy", "not_analogy")
    )


def derived_decision(j: AnalogyJudgment) -> Decision:
    """`analogy_decision` for one answer, to check the model's own decision before accepting it."""
    one = pa.table(
        {
            "structural_analogy": [j.structural_analogy],
            "transfer_holds": [j.transfer_holds],
            "transferable": [j.transferable],
        }
    )
    return analogy_decision(one)[0].as_py()


def analogy_passed(judged: pa.Table, *, hold_out_flagged: bool) -> pa.ChunkedArray:
    """Pairs that go on to the transfer check: an `ok` answer whose decision passes, unless its
    inputs hold instruction-like text (`input_flags`) and flagged pairs are held out — a model
    that obeys such text can still answer a consistent, accepting judgment."""
    passed = pc.and_(
        pc.equal(judged["status"], "ok"),
        pc.fill_null(pc.is_in(judged["decision"], value_set=pa.array(PASSING)), False),
    )
    if hold_out_flagged:
        passed = pc.and_(passed, pc.equal(pc.list_value_length(judged["input_flags"]), 0))
    return passed


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def analogy_problems(j: AnalogyJudgment) -> list[str]:
    """Every way an analogy judgment breaks the decision rules (empty: consistent)."""
    problems = []
    if j.transfer_holds and not j.transferable:
        problems.append("transfer_holds is true, so transferable must be true")
    if j.same_problem and (
        j.object_mappings
        or j.shared_relations
        or j.structural_analogy
        or j.transfer_holds
        or j.transferable
        or j.decision != "not_analogy"
    ):
        problems.append(
            "same_problem is true: mappings and relations must be empty, every other boolean "
            "false and decision not_analogy"
        )
    if j.structural_analogy and (len(j.object_mappings) < 2 or not j.shared_relations):
        problems.append("a structural analogy needs at least two mappings and one shared relation")
    q_objects = {_norm(m.q_object) for m in j.object_mappings}
    d_objects = {_norm(m.d_object) for m in j.object_mappings}
    for rel in j.shared_relations:
        if len(rel.q_arguments) != len(rel.d_arguments) or not rel.q_arguments:
            problems.append(f"relation {rel.predicate!r} needs the same arguments on both sides")
        unmapped = [a for a in rel.q_arguments if _norm(a) not in q_objects] + [
            a for a in rel.d_arguments if _norm(a) not in d_objects
        ]
        if unmapped:
            problems.append(f"relation {rel.predicate!r} has unmapped arguments: {unmapped}")
    if j.decision != derived_decision(j):
        problems.append(
            f"decision {j.decision} contradicts the booleans, which give {derived_decision(j)}"
        )
    return problems


class TransferVerdict(_Answer):
    verdict: Literal["transfer", "reject"]
    reject_reason: Literal["same_problem", "background_only", "unsupported_mappings"] | None
    reason: str = Field(max_length=400)


def transfer_verified(verdicts: pa.Table) -> pa.ChunkedArray:
    """Pairs the second judge confirmed: an `ok` answer with verdict "transfer"."""
    return pc.and_(
        pc.equal(verdicts["status"], "ok"),
        pc.fill_null(pc.equal(verdicts["verdict"], "transfer"), False),
    )


def transfer_problems(v: TransferVerdict) -> list[str]:
    if v.verdict == "transfer" and v.reject_reason is not None:
        return ["a transfer verdict has no reject_reason (use null)"]
    if v.verdict == "reject" and v.reject_reason is None:
        return ["a reject verdict needs a reject_reason"]
    return []


class ProblemStatement(_Answer):
    problem: str = Field(
        max_length=500, description="1-2 sentences: the difficulty q faced, not its method."
    )


# The form of a query is part of the contract, so the schema itself constrains it where the
# endpoint supports patterns (llama.cpp grammars, vLLM structured output); the rules below hold
# either way.
QUERY_PATTERN = r"^[Hh]ow to [a-z0-9][a-z0-9 ,;:'()/-]*\?$"


class WrittenQuery(_Answer):
    query: str = Field(pattern=QUERY_PATTERN, max_length=320)


class QueryReview(_Answer):
    problem_only: bool
    grounded: bool
    well_formed: bool
    issue: str | None = Field(max_length=300)


META_WORDS = ("analogy", "analogous", "mapping", "mappings", "cited", "citation", "paper")
METHOD_PHRASES = (
    "by using",
    "by applying",
    "by means of",
    "through the use of",
    "with the help of",
    "via ",
)
MAX_QUERY_WORDS = 45


def query_rule_violations(query: str) -> list[str]:
    """The mechanical rules every query must pass, whatever the reviewer said."""
    problems = []
    text = query.strip()
    if not text.startswith(("How to ", "how to ")):
        problems.append('must start with "How to"')
    if re.search(r"\[\s*(citation|\d+)[^\]]*\]|\(\s*[A-Z][a-z]+ et al\.", text, re.I):
        problems.append("contains a citation marker")
    if any(tok.isupper() and len(tok) > 1 for tok in re.findall(r"[A-Za-z]+", text)):
        problems.append("contains an upper-case token (acronym or variable)")
    words = re.findall(r"[a-z']+", text.lower())
    meta = sorted({w for w in words if w in META_WORDS})
    if meta:
        problems.append(f"contains meta-language: {', '.join(meta)}")
    low = text.lower()
    method = [p.strip() for p in METHOD_PHRASES if p in low]
    if method:
        problems.append(f"names a method: {', '.join(method)}")
    if len(text.split()) > MAX_QUERY_WORDS:
        problems.append(f"longer than {MAX_QUERY_WORDS} words")
    return problems


def query_objections(
    query: str, *, problem_only: bool, grounded: bool, well_formed: bool, issue: str | None
) -> list[str]:
    """Why a written query is not accepted (empty: accepted): the reviewer's booleans, then the
    mechanical rules. The writer regenerates with these; afterwards they decide the kept query."""
    review_ok = problem_only and grounded and well_formed
    reasons = [] if review_ok else [issue or "the reviewer rejected it"]
    return reasons + query_rule_violations(query)


class SameProblem(_Answer):
    same_problem: bool = Field(description="Would a paper that answers one answer the other?")
    reason: str = Field(max_length=300)


class Usefulness(_Answer):
    reasoning: str = Field(max_length=600, description="Brief: intent match and trustworthiness.")
    score: int = Field(ge=0, le=3)


_FINAL_SCORE = re.compile(r"(?:score|final)[^0-9]{0,20}([0-3])(?!\d)", re.I)


def parse_usefulness_text(text: str) -> Usefulness | None:
    """A grader that ignored the JSON form still ends with its score: take the last one."""
    found = _FINAL_SCORE.findall(text)
    if not found:
        tail = re.findall(r"(?<!\d)([0-3])(?!\d)", text[-40:])
        found = tail
    return Usefulness(reasoning=text.strip()[:600], score=int(found[-1])) if found else None
