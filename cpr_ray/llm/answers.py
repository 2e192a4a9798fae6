"""The LLM layer's answer-contract framework: an answer is a pydantic model whose enums, fields
and scales are the contract (the models themselves live next to their tasks: `queries.analogy`,
`queries.writing`, `queries.dedup`, `queries.usefulness`, `queries.synthesis`,
`retrieval.llm_judge`, `evaluate.rewriters`).

Where JSON Schema can say a rule, the schema sent to the endpoint says it too
(`constrained_schema`, from each model's `branches`): a grammar-constrained model then cannot write
most inconsistent answers, and fewer calls are re-asked; every answer is still checked after it
arrives by its task's rule functions, and decisions are pure functions of the answers applied
after every cache read. Pins (`llm.stages.STAGE.pin`) are checked here against every answer model
a process has loaded (`check_pins`): a build's preflight has loaded them all.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict

from cpr_ray.config import LLMConfig
from cpr_ray.errors import ConfigError


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
    # property schemas the constrained form sends in place of a field's own: a rule JSON Schema
    # can spell only at length (distinct relation arguments), which a grammar enforces; the
    # plain form (`json_schema_plain`, for providers that refuse such schemas) keeps the field's
    constrained_properties: ClassVar[Mapping[str, dict[str, Any]]] = {}

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
        if cls.constrained_properties:
            properties = {**schema["properties"], **cls.constrained_properties}
            schema = {**schema, "properties": properties}
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
    label: dict[str, Any] = {k: prop[k] for k in ("title", "description") if k in prop}
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


def check_pins(llm: LLMConfig, stages: Iterable[str] | None = None) -> None:
    """Each stage's pin (of `stages`, else every stage configured) names fields of the answer
    models and leaves each model holding them an answer. Run by the LLM layer before a build
    starts Ray and before a task asks (the settings tree knows no answer contracts), so a bad pin
    is one config line, never an actor's error. It sees the answer models this process has
    loaded: a build's preflight has loaded every stage's."""
    for stage, options in llm.stages.items():
        if stages is not None and stage not in stages:
            continue
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


def normalized(text: str) -> str:
    """Lower case, single spaces: how rules compare texts."""
    return " ".join(text.lower().split())
