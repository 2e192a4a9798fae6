"""The analogy judgment (B.1) and the transfer verdict (B.2): their answer contracts and the
rules that derive decisions from them (`analogy_decision`, `analogy_passed`,
`transfer_verified`), applied after every cache read so the cache keeps what the model said.
A model that obeys injected text *consistently* passes these checks; that is caught on the inputs
instead (`cpr_ray/llm/injection.py`).
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import AfterValidator, Field

from cpr_ray.llm.answers import Branch, Items, _Answer

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
# what a passing analogy carries over from d: a contribution of its own
CONTRIBUTIONS: tuple[TransferType, ...] = (
    "method",
    "problem_formulation",
    "evaluation_design",
    "data_construction",
    "finding_or_evidence",
)
NOT_SAME_PROBLEM = tuple(t for t in get_args(TransferType) if t != "same_problem")
Decision = Literal["observed_analogy", "potential_analogy", "not_analogy"]
PASSING: tuple[Decision, ...] = ("observed_analogy", "potential_analogy")

# What rules a pair out once the answer has mapped it, in the order the answer tests them: each
# one is a way the mappings, relations and path just written fail to carry anything over. One
# set decides not_analogy, and the stored record drops the mappings and relations
# (`analogy_record`): the model wrote them before it tried to break them, and nothing later may
# read a falsified correspondence as if it held.
EXCLUSIONS: dict[str, str] = {
    "background_only": "what you mapped only frames Q's story: D is cited for context, "
    "motivation, a contrast with Q's own work or evidence for a claim, and nothing of D's "
    "moves through the mappings (a component, measure or resource of D that Q reshapes through "
    "them is not background)",
    "tool_or_data_as_is": "what you mapped is a tool, dataset, benchmark, pretrained resource, "
    "measuring instrument or lookup source of D that Q runs unchanged; a change to it counts "
    "only where your mappings carry that change",
    "terminology_only": "the mappings pair words or a metaphor Q borrows from D, with no "
    "relation holding on both sides",
    "surface_similarity": "the mappings pair things that only look alike (both involve "
    "networks), not objects in the same role",
    "unsupported_possibility": "the mappings make a link conceivable, but the texts do not back it",
    "off_goal_mapping": "the objects pair up, but what the pairing carries does nothing for "
    "Q's goal",
    "adoption_without_transfer": "Q takes something of D without carrying any mapped relation over",
}


OBJECT_CHARS = 80


class ObjectMapping(_Answer):
    q_object: str = Field(
        max_length=OBJECT_CHARS, description="An object of the citing paper's problem."
    )
    d_object: str = Field(
        max_length=OBJECT_CHARS, description="The object of the cited paper playing the same role."
    )
    role: str = Field(max_length=120, description="The role both objects play.")


MAX_MAPPINGS = 8  # the method's 4 to 8, when the texts support them
# A relation holds between objects (one alone is a property) and over *mapped* ones: its
# arguments are the numbers of distinct mappings (from 1), so the same relation reads over their
# q objects on q's side and over their d objects on d's, and no argument can name an object that
# was not mapped. Three arguments cover the method's relations (Converts(x, y)); the bounds keep
# a whole answer within a stage's max_tokens (a grammar-held model writes lists to their bound).
MIN_ARGUMENTS, MAX_ARGUMENTS, MAX_RELATIONS = 2, 3, 4
MappingNumber = Annotated[int, Field(ge=1, le=MAX_MAPPINGS)]
ARGUMENTS_WHY = (
    "The numbers (from 1) of the distinct mappings it holds over, in order: over their q objects "
    "in Q's problem and over their d objects in D's."
)


def _distinct(arguments: list[int]) -> list[int]:
    if len(set(arguments)) < len(arguments):
        raise ValueError(
            f"a relation's arguments are distinct mappings: {arguments} names one mapping twice, "
            "and a predicate over one object is a property, not a relation"
        )
    return arguments


def distinct_arguments_schema() -> dict[str, Any]:
    """`arguments` as JSON Schema: 2 to 3 distinct mapping numbers, spelled out as one
    alternative per choice of all but the last number (the last an enum of the rest). JSON
    Schema's own `uniqueItems` would say it in one word, but llama.cpp's grammar ignores it and
    vLLM's grammar backends refuse or drop it; `prefixItems` all of them enforce (no `items`
    beside it, which llama.cpp would read instead: min/maxItems fix the length)."""
    numbers = range(1, MAX_MAPPINGS + 1)
    alternatives = []
    for n in range(MIN_ARGUMENTS, MAX_ARGUMENTS + 1):
        for head in itertools.permutations(numbers, n - 1):
            rest = [k for k in numbers if k not in head]
            alternatives.append(
                {
                    "type": "array",
                    "prefixItems": [*({"const": k} for k in head), {"enum": rest}],
                    "minItems": n,
                    "maxItems": n,
                }
            )
    return {"title": "Arguments", "description": ARGUMENTS_WHY, "anyOf": alternatives}


class SharedRelation(_Answer):
    predicate: str = Field(
        max_length=60, description="A relation holding on both sides, e.g. Converts."
    )
    arguments: Annotated[list[MappingNumber], AfterValidator(_distinct)] = Field(
        min_length=MIN_ARGUMENTS, max_length=MAX_ARGUMENTS, description=ARGUMENTS_WHY
    )

    constrained_properties = {"arguments": distinct_arguments_schema()}

    def sides(self, mappings: list[ObjectMapping]) -> tuple[list[str], list[str]]:
        """(q arguments, d arguments): the objects of the mappings it names."""
        named = [mappings[n - 1] for n in self.arguments if 1 <= n <= len(mappings)]
        return [m.q_object for m in named], [m.d_object for m in named]


PATH_CHARS = 200


class TransferPath(_Answer):
    """The method's transfer path in its three parts, so that query writing can be told what q
    took from d (`from_d`) without being handed q's goal (`helps_q`)."""

    from_d: str = Field(
        max_length=PATH_CHARS, description="What comes from D: its method, formulation or finding."
    )
    through_mappings: str = Field(
        max_length=PATH_CHARS, description="How the object mappings carry it to Q's problem."
    )
    helps_q: str = Field(max_length=PATH_CHARS, description="How it helps Q reach its goal.")


def _exclusion_field(why: str) -> Any:
    return Field(description=f"True when {why}.")


class AnalogyJudgment(_Answer):
    """Fields in the order the method works: same problem (which alone leaves nothing to map);
    the mappings, relations, transfer type and path; every exclusion, each a test of what was
    just mapped; then structure, transfer and the decision."""

    same_problem: bool = Field(
        description="True when D is earlier work on Q's own problem or task line, also when D "
        "works on it in another dataset, population, language or setting."
    )
    object_mappings: list[ObjectMapping] = Field(max_length=MAX_MAPPINGS)
    shared_relations: list[SharedRelation] = Field(max_length=MAX_RELATIONS)
    transfer_type: TransferType
    transfer_path: TransferPath
    background_only: bool = _exclusion_field(EXCLUSIONS["background_only"])
    tool_or_data_as_is: bool = _exclusion_field(EXCLUSIONS["tool_or_data_as_is"])
    terminology_only: bool = _exclusion_field(EXCLUSIONS["terminology_only"])
    surface_similarity: bool = _exclusion_field(EXCLUSIONS["surface_similarity"])
    unsupported_possibility: bool = _exclusion_field(EXCLUSIONS["unsupported_possibility"])
    off_goal_mapping: bool = _exclusion_field(EXCLUSIONS["off_goal_mapping"])
    adoption_without_transfer: bool = _exclusion_field(EXCLUSIONS["adoption_without_transfer"])
    structural_analogy: bool
    transfer_holds: bool
    transferable: bool
    reason: str = Field(max_length=400)
    decision: Decision

    branches = (
        Branch(
            "same problem: nothing mapped, nothing holds",
            {
                "same_problem": True,
                "object_mappings": Items(max=0),
                "shared_relations": Items(max=0),
                "structural_analogy": False,
                "transfer_holds": False,
                "transferable": False,
                "transfer_type": "same_problem",
                "decision": "not_analogy",
            },
        ),
        Branch(
            "an exclusion found in what was mapped (or nothing found): whatever was mapped, "
            "nothing holds",
            {
                "same_problem": False,
                "structural_analogy": False,
                "transfer_holds": False,
                "transferable": False,
                "transfer_type": NOT_SAME_PROBLEM,
                "decision": "not_analogy",
            },
        ),
        *(
            Branch(
                "no exclusion, no structural analogy, whatever was mapped (transfer_holds "
                "implies transferable)",
                {
                    "same_problem": False,
                    **dict.fromkeys(EXCLUSIONS, False),
                    "structural_analogy": False,
                    "transfer_holds": holds,
                    "transferable": transferable,
                    "transfer_type": NOT_SAME_PROBLEM,
                    "decision": "not_analogy",
                },
            )
            for holds, transferable in ((False, (False, True)), (True, True))
        ),
        *(
            Branch(
                f"no exclusion, a structural analogy (two mappings and a relation at least): "
                f"{decision}",
                {
                    "same_problem": False,
                    **dict.fromkeys(EXCLUSIONS, False),
                    "object_mappings": Items(min=2),
                    "shared_relations": Items(min=1),
                    "structural_analogy": True,
                    "transfer_holds": holds,
                    "transferable": transferable,
                    "transfer_type": CONTRIBUTIONS if decision in PASSING else NOT_SAME_PROBLEM,
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

    @property
    def exclusions(self) -> list[str]:
        """The exclusions the model found, same_problem first."""
        flags = {"same_problem": self.same_problem} | {k: getattr(self, k) for k in EXCLUSIONS}
        return [name for name, value in flags.items() if value]


def analogy_decision(answers: pa.Table) -> pa.ChunkedArray:
    """The decision the answer implies: the only decision the pipeline ever acts on.

    Over a table of answers (`exclusions`, `transfer_type`, `structural_analogy`,
    `transfer_holds`, `transferable`), so it runs after every cache read and a changed rule
    reaches old answers; null where there is no answer. Same problem or any exclusion, or a
    transfer that carries no contribution of d, is not an analogy whatever the booleans say.
    """
    ruled_out = pc.or_(
        pc.greater(pc.list_value_length(answers["exclusions"]), 0),
        pc.invert(pc.is_in(answers["transfer_type"], value_set=pa.array(CONTRIBUTIONS))),
    )
    structural = pc.and_(answers["structural_analogy"], pc.invert(ruled_out))
    observed = pc.and_(structural, answers["transfer_holds"])
    potential = pc.and_(structural, answers["transferable"])
    return pc.if_else(
        observed, "observed_analogy", pc.if_else(potential, "potential_analogy", "not_analogy")
    )


def analogy_record(answers: pa.Table) -> pa.Table:
    """The answers as a build stores them: where the answer names same problem or any
    exclusion, its mappings and relations emptied (the method's rule: an excluded pair keeps no
    correspondence). Applied after every cache read, like `analogy_decision`, so the cache
    keeps what the model wrote and a later reader never sees a falsified mapping."""
    excluded = pc.greater(pc.list_value_length(answers["exclusions"]), 0)
    for column in ("object_mappings", "shared_relations"):
        if column not in answers.column_names:
            continue  # a table of the decision's columns only
        kept = answers[column]
        empty = pa.array([[]] * len(answers), kept.type)
        index = answers.schema.get_field_index(column)
        answers = answers.set_column(index, column, pc.if_else(excluded, empty, kept))
    return answers


def derived_decision(j: AnalogyJudgment) -> Decision:
    """`analogy_decision` for one answer, to check the model's own decision before accepting it."""
    one = pa.table(
        {
            "exclusions": pa.array([j.exclusions], pa.list_(pa.string())),
            "transfer_type": [j.transfer_type],
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
    excluded = [e for e in j.exclusions if e != "same_problem"]
    holds_nothing = not (
        j.structural_analogy or j.transfer_holds or j.transferable or j.decision in PASSING
    )
    if j.same_problem and (j.object_mappings or j.shared_relations or not holds_nothing):
        problems.append(
            "same_problem is true: mappings and relations must be empty, every other boolean "
            "false and decision not_analogy"
        )
    elif excluded and not holds_nothing:
        problems.append(
            f"{', '.join(excluded)} is true: structural_analogy, transfer_holds and "
            "transferable must be false and decision not_analogy"
        )
    if j.same_problem != (j.transfer_type == "same_problem"):
        problems.append('transfer_type is "same_problem" exactly when same_problem is true')
    transfers = j.structural_analogy and j.transferable
    if (transfers or j.decision in PASSING) and j.transfer_type not in CONTRIBUTIONS:
        problems.append(
            "a structural analogy that carries over (a passing decision) carries a contribution "
            f"of D ({', '.join(CONTRIBUTIONS)}), not {j.transfer_type}"
        )
    if j.structural_analogy and (len(j.object_mappings) < 2 or not j.shared_relations):
        problems.append("a structural analogy needs at least two mappings and one shared relation")
    for rel in j.shared_relations:
        unmapped = [n for n in rel.arguments if n > len(j.object_mappings)]
        if unmapped:
            problems.append(
                f"relation {rel.predicate!r} names mapping(s) {unmapped}, but "
                f"{len(j.object_mappings)} were given"
            )
    if j.decision != derived_decision(j):
        problems.append(
            f"decision {j.decision} contradicts the rest of the answer, which gives "
            f"{derived_decision(j)}"
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
