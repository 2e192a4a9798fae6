"""The base of every settings section (frozen, unknown keys refused, and a fingerprint), and the
one way a section becomes the options of what it configures (`derive`).

Its own module so `storage` (which owns `StorageConfig`) and `config` (which owns the tree) build
on it without importing each other.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

# the two constraints most settings share, named once: a count or size (rows, actors, ports,
# buckets) is a whole number of at least 1, an amount (CPUs, seconds, dollars, rates) is above 0
Count = Annotated[int, Field(ge=1)]
Positive = Annotated[float, Field(gt=0)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # fields that say how a stage runs, not what it computes: left out of the stage fingerprint
    # (`Config.section_hash`), so e.g. the local judge's new port each run reruns nothing
    operational: ClassVar[frozenset[str]] = frozenset()

    def fingerprint(self) -> dict[str, Any]:
        """The section's settings as JSON, less its operational fields and those of every
        section nested in it (a pooler's `encoder:` inside `pooling:`)."""
        dumped = self.model_dump(mode="json", exclude=set(self.operational))
        return {name: _nested(getattr(self, name), value) for name, value in dumped.items()}


def _nested(value: Any, dumped: Any) -> Any:
    """`dumped` (the JSON dump of `value`) with nested sections' operational fields left out."""
    if isinstance(value, Section):
        return value.fingerprint()
    if isinstance(value, (list, tuple)) and isinstance(dumped, list):
        return [_nested(v, d) for v, d in zip(value, dumped)]
    if isinstance(value, dict) and isinstance(dumped, dict) and len(value) == len(dumped):
        return {k: _nested(v, d) for (k, d), v in zip(dumped.items(), value.values())}
    return dumped


def derive(options: type[T], section: BaseModel, **given: Any) -> T:
    """The `options` (a dataclass or a pydantic model) that a component takes, made from the
    `section` that configures it: each field the two name alike takes the section's value, and
    `given` ones win. The one mapping of a config section onto what it configures, so neither
    renames the other's settings and a setting reaches its component by being named alike."""
    names = (
        options.model_fields
        if issubclass(options, BaseModel)
        else [f.name for f in dataclasses.fields(options)]  # type: ignore[arg-type]
    )
    shared = {name: getattr(section, name) for name in names if name in type(section).model_fields}
    return options(**{**shared, **given})
