"""The base of every settings section: frozen, unknown keys refused, and a fingerprint.

Its own module so `storage` (which owns `StorageConfig`) and `config` (which owns the tree) build
on it without importing each other.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # fields that say how a stage runs, not what it computes: left out of the stage fingerprint
    # (`Config.section_hash`), so e.g. the local judge's new port each run reruns nothing
    operational: ClassVar[frozenset[str]] = frozenset()

    def fingerprint(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude=set(self.operational))
