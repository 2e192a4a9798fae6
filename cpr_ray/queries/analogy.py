"""The analogy judgment (B.1) and the transfer verdict (B.2): their answer contracts and the
rules that derive decisions from them (`analogy_decision`, `analogy_passed`,
`transfer_verified`), applied after every cache read so the cache keeps what the model said.
A model that obeys injected text *consistently* passes these checks; that is caught on the inputs
instead (`cpr_ray/llm/injection.py`).
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from cpr_ray.llm.answers import Branch, Items, _Answer, normalized

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


OBJECT_CHARS = 80


class ObjectMapping(_Answer):
    q_object: str = Field(
        max_length=OBJECT_CHARS, description="An object of the citing paper's problem."
    )
    d_object: str = Field(
        max_length=OBJECT_CHARS, description="The object of the cited paper playing the same role."
    )
    role: str = Field(max_length=120, description="The role both objects play.")


MAX_ARGUMENTS = 4
# an argument is one of the mapped objects, so it is no longer than they are
Argument = Annotated[str, Field(max_length=OBJECT_CHARS)]


class SharedRelation(_Answer):
    predicate: str = Field(
        max_length=60, description="A relation holding on both sides, e.g. Converts."
    )
    q_arguments: list[Argument] = Field(
        max_length=MAX_ARGUMENTS, description="Its arguments among the mapped q objects."
    )
    d_arguments: list[Argument] = Field(
        max_length=MAX_ARGUMENTS, description="The mapped d objects, in the same order."
    )

    branches = tuple(
        Branch(
            f"{n} argument(s) on each side",
            {"q_arguments": Items(n, n), "d_arguments": Items(n, n)},
        )
        for n in range(1, MAX_ARGUMENTS + 1)
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

    branches = (
        Branch(
            "same problem or an exclusion: nothing mapped, nothing holds",
            {
                "object_mappings": Items(max=0),
                "shared_relations": Items(max=0),
                "structural_analogy": False,
                "transfer_holds": False,
                "transferable": False,
                "decision": "not_analogy",
            },
        ),
        *(
            Branch(
                "no structural analogy, whatever was mapped (transfer_holds implies transferable)",
                {
                    "same_problem": False,
                    "structural_analogy": False,
                    "transfer_holds": holds,
                    "transferable": transferable,
                    "decision": "not_analogy",
                },
            )
            for holds, transferable in ((False, (False, True)), (True, True))
        ),
        *(
            Branch(
                f"a structural analogy (two mappings and a relation at least): {decision}",
                {
                    "same_problem": False,
                    "object_mappings": Items(min=2),
                    "shared_relations": Items(min=1),
                    "structural_analogy": True,
                    "transfer_holds": holds,
                    "transferable": transferable,
                    "decision": decision,
                },
            )
            for holds, transferable, decision in (
                (True, True, "observed_analogy"),
                (False, True, "potential_analogy"),
                (False, False, "not_analogy"),
            )
        ),
    )


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
    q_objects = {normalized(m.q_object) for m in j.object_mappings}
    d_objects = {normalized(m.d_object) for m in j.object_mappings}
    for rel in j.shared_relations:
        if len(rel.q_arguments) != len(rel.d_arguments) or not rel.q_arguments:
            problems.append(f"relation {rel.predicate!r} needs the same arguments on both sides")
        unmapped = [a for a in rel.q_arguments if normalized(a) not in q_objects] + [
            a for a in rel.d_arguments if normalized(a) not in d_objects
        ]
        if unmapped:
            problems.append(f"relation {rel.predicate!r} has unmapped arguments: {unmapped}")
    if j.decision != derived_decision(j):
        problems.append(
            f"decision {j.decision} contradicts the booleans, which give {derived_decision(j)}"
        )
    return problems


RejectReason = Literal["same_problem", "background_only", "unsupported_mappings"]


class TransferVerdict(_Answer):
    verdict: Literal["transfer", "reject"]
    reject_reason: RejectReason | None
    reason: str = Field(max_length=400)

    branches = (
        Branch("a transfer has no reject reason", {"verdict": "transfer", "reject_reason": None}),
        Branch(
            "a reject names its reason",
            {"verdict": "reject", "reject_reason": get_args(RejectReason)},
        ),
    )


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
