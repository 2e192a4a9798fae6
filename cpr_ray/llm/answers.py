"""The answer contracts of every LLM step (paper App. B), and the rules answers must obey.

The enums, fields and scales are the contract; prompts only explain them. Consistency rules are
enforced in code (`*_problems` return what is wrong, for a re-ask), so a model cannot answer in
contradiction with them. Where JSON Schema can say a rule, the schema sent to the endpoint says it
too (`constrained_schema`, from each model's `branches`): a grammar-constrained model then cannot
write most inconsistent answers, and fewer calls are re-asked; every answer is still checked after
it arrives. Decisions (`analogy_decision`, `analogy_passed`, `transfer_verified`,
`query_objections`) are pure functions of the answers, applied after every cache read: the cache
keeps what the model said, and a changed rule reaches old answers without a call. A model that
obeys injected text *consistently* passes these checks; that is caught on the inputs instead
(`cpr_ray/llm/injection.py`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from cpr_ray.config import LLMConfig
from cpr_ray.errors import ConfigError

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


@dataclass(frozen=True)
class Items:
    """A branch's bounds on a list field's length, inside the model's own bounds."""

    min: int = 0
    max: int | None = None


@dataclass(frozen=True)
class Branch:
    """One way an answer may be consistent: field name → the value it must have (a constant),
    a tuple of allowed values, or `Items` bounds; fields not named keep the model's schema."""

    why: str
    fields: Mapping[str, Any]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # the decision rules that JSON Schema can express; an answer must fit one branch (none: the
    # model's schema as it is). Rules that compare values (an argument is a mapped object)
    # cannot be said in a schema and are only checked after arrival.
    branches: ClassVar[tuple[Branch, ...]] = ()

    @classmethod
    def constrained_schema(cls, pin: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The model's JSON schema with its branches, and those of the models it nests, as
        `anyOf` alternatives, so that grammar-constrained decoding (llama.cpp's server, vLLM's
        xgrammar or guidance) enforces the rules token by token.

        `pin` fixes top-level fields to one value (`llm.stages.STAGE.pin`), keeping only the
        branches that allow it: the dry run's placeholder model decides nothing that means
        anything, so its profile pins the passing answer and every later stage gets rows."""
        schema = cls.model_json_schema()
        defs = schema.pop("$defs", {})
        for nested in _nested_answers(cls):
            defs[nested.__name__] = nested._branched(defs[nested.__name__])
        out = cls._branched(schema, pin or {})
        return {**out, "$defs": defs} if defs else out

    @classmethod
    def _branched(
        cls, schema: dict[str, Any], pin: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        pin = pin or {}
        unknown = set(pin) - set(schema["properties"])
        if unknown:
            raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)} to pin")
        if not cls.branches and not pin:
            return schema
        alternatives = []
        for branch in cls.branches or (Branch(cls.__name__, {}),):
            unknown = set(branch.fields) - set(schema["properties"])
            if unknown:
                raise TypeError(f"{cls.__name__} branch {branch.why!r} names {sorted(unknown)}")
            if not all(_allows(branch.fields.get(name), value) for name, value in pin.items()):
                continue
            rules = {**branch.fields, **pin}
            properties = {
                name: _narrow(prop, rules[name]) if name in rules else prop
                for name, prop in schema["properties"].items()
            }
            alternatives.append({**schema, "description": branch.why, "properties": properties})
        if not alternatives:
            raise ValueError(f"pinning {dict(pin)} leaves no consistent {cls.__name__} answer")
        if len(alternatives) == 1:
            return alternatives[0]
        # anyOf must stand alone: llama.cpp ignores the keywords beside it
        return {"title": schema["title"], "anyOf": alternatives}


def _allows(rule: Any, value: Any) -> bool:
    """Whether a branch's rule for a field admits one pinned value (a list cannot be pinned)."""
    if rule is None:
        return True
    if isinstance(rule, Items):
        return False
    return value in rule if isinstance(rule, tuple) else rule == value


def _narrow(prop: dict[str, Any], rule: Any) -> dict[str, Any]:
    """A property's schema under one branch's rule for it."""
    label = {k: prop[k] for k in ("title", "description") if k in prop}
    if isinstance(rule, Items):
        out = copy.deepcopy(prop)
        out["minItems"] = max(rule.min, prop.get("minItems", 0))
        if rule.max is not None:
            out["maxItems"] = min(rule.max, prop.get("maxItems", rule.max))
        return out
    if isinstance(rule, tuple):
        return {**label, "enum": list(rule)}
    return {**label, "const": rule}


def _nested_answers(model: type[BaseModel]) -> Iterator[type[_Answer]]:
    """The answer models a model holds in its fields (lists and optionals included), deep."""
    seen: set[type] = set()

    def walk(annotation: Any) -> Iterator[type[_Answer]]:
        if isinstance(annotation, type) and issubclass(annotation, _Answer):
            if annotation not in seen:
                seen.add(annotation)
                yield annotation
                for field in annotation.model_fields.values():
                    yield from walk(field.annotation)
        for arg in get_args(annotation):
            yield from walk(arg)

    for field in model.model_fields.values():
        yield from walk(field.annotation)


def check_pins(llm: LLMConfig) -> None:
    """Every stage's pin names fields of the answer models and leaves each model holding them an
    answer. Run by the LLM layer before a build starts Ray and before any stage asks (the settings
    tree knows no answer contracts), so a bad pin is one config line, never an actor's error."""
    for stage, options in llm.stages.items():
        try:
            check_pin(options.pin)
        except ValueError as exc:
            raise ConfigError(f"invalid config: llm.stages.{stage}.pin: {exc}") from None


def check_pin(pin: Mapping[str, Any]) -> None:
    """One pin (see `check_pins`); ValueError naming what is wrong."""
    models = [m for m in _answer_models() if set(pin) & set(m.model_fields)]
    known = set().union(*(m.model_fields for m in _answer_models()))
    unknown = sorted(set(pin) - known)
    if unknown:
        raise ValueError(f"no answer has field(s) {', '.join(unknown)} to pin")
    for model in models:
        constrained_schema(model, pin)


def _answer_models() -> list[type[_Answer]]:
    found, todo = [], list(_Answer.__subclasses__())
    while todo:
        model = todo.pop()
        found.append(model)
        todo.extend(model.__subclasses__())
    return found


def constrained_schema(
    model: type[BaseModel], pin: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The schema to send for any answer model: with the rules' branches where it declares them,
    and the stage's pinned fields that this model has."""
    if not issubclass(model, _Answer):
        return model.model_json_schema()
    own = {k: v for k, v in (pin or {}).items() if k in model.model_fields}
    return model.constrained_schema(own)


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


class ProblemStatement(_Answer):
    problem: str = Field(
        max_length=500, description="1-2 sentences: the difficulty q faced, not its method."
    )


MAX_QUERY_WORDS = 45
QUERY_CHARS = 320  # about 45 words of seven characters
WORD_CHARS = 32  # longer than any word a query needs

# The form of a query is part of the contract, so the schema itself constrains it where the
# endpoint supports patterns (llama.cpp grammars, vLLM structured output): one lower-case "How to"
# question of at most MAX_QUERY_WORDS single-spaced words, ending in its only "?", with no
# brackets, capitals or full stops, so no citation marker ("[3]", "(Smith et al.") can be written.
# Grammars enforce the pattern, not maxLength (llama.cpp ignores it beside a pattern), so the word
# bound lives in the pattern. The rules below hold either way.
QUERY_PATTERN = rf"^[Hh]ow to(?: [a-z0-9,;:'()/-]{{1,{WORD_CHARS}}}){{1,{MAX_QUERY_WORDS - 2}}}\?$"


class WrittenQuery(_Answer):
    query: str = Field(pattern=QUERY_PATTERN, max_length=QUERY_CHARS)


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


# a usefulness of 2 or more is usable (B.5): positives keep it, negatives (N2) must stay below it
KEEP_USEFULNESS = 2


_FINAL_SCORE = re.compile(r"(?:score|final)[^0-9]{0,20}([0-3])(?!\d)", re.I)


def parse_usefulness_text(text: str) -> Usefulness | None:
    """A grader that ignored the JSON form still ends with its score: take the last one."""
    found = _FINAL_SCORE.findall(text)
    if not found:
        tail = re.findall(r"(?<!\d)([0-3])(?!\d)", text[-40:])
        found = tail
    return Usefulness(reasoning=text.strip()[:600], score=int(found[-1])) if found else None


# -- multi-query synthesis (complexity-aware training) -------------------------------------------

QUERY_KINDS = ("factual", "procedural", "causal", "conditional", "keyword", "comparison")
# a word of a synthesized query: no spaces, no question mark, no longer than any word a query needs
_WORD = rf"[A-Za-z0-9,;:'()/%+.-]{{1,{WORD_CHARS}}}"
_WORDS = rf"(?: {_WORD}){{1,40}}"  # with the opening: at most MAX_QUERY_WORDS
# each kind opens its own way, so the six of one answer can never be the same string, and a
# grammar-constrained model cannot run on past the word bound
KIND_PATTERNS = {
    "factual": rf"^What{_WORDS}\?$",
    "procedural": rf"^How to{_WORDS}\?$",
    "causal": rf"^Why{_WORDS}\?$",
    "conditional": rf"^(?:If|When){_WORDS}\?$",
    "keyword": rf"^[a-z0-9-]{{2,{WORD_CHARS}}}(?: [a-z0-9-]{{2,{WORD_CHARS}}}){{1,7}}$",
    "comparison": rf"^(?:How does|How do|Which){_WORDS}\?$",
}
SynthQuery = Annotated[
    str, Field(pattern=rf"^{_WORD}(?: {_WORD}){{1,44}}\??$", max_length=QUERY_CHARS)
]


def _kind(kind: str, what: str) -> Any:
    return Field(pattern=KIND_PATTERNS[kind], max_length=QUERY_CHARS, description=what)


class DiverseQueries(_Answer):
    """One query of each kind, as fields: a schema can require every kind exactly once."""

    factual: str = _kind("factual", "What … ? A fact or quantity the paper reports.")
    procedural: str = _kind("procedural", "How to … ? How to do what the paper does.")
    causal: str = _kind("causal", "Why … ? Why something happens, or what causes it.")
    conditional: str = _kind("conditional", "If/When … ? What happens under a condition.")
    keyword: str = _kind("keyword", "2-8 lower-case search keywords.")
    comparison: str = _kind("comparison", "How does/How do/Which … ? How two things compare.")


class Paraphrases(_Answer):
    paraphrases: list[SynthQuery] = Field(min_length=2, max_length=len(QUERY_KINDS))


def synthesized_problems(queries: Sequence[str], seed: str | None = None) -> list[str]:
    """What makes a synthesized set unusable as several training queries: blanks, repeats, a
    query over the word bound, a paraphrase that only copies its seed."""
    problems = []
    normal = [_norm(q) for q in queries]
    if len(set(normal)) < len(normal):
        problems.append("two queries are the same; each must be different")
    long = [q for q in queries if len(q.split()) > MAX_QUERY_WORDS]
    if long:
        problems.append(f"{len(long)} query(ies) longer than {MAX_QUERY_WORDS} words")
    if seed is not None and _norm(seed) in normal:
        problems.append("a paraphrase repeats the query word for word")
    return problems
