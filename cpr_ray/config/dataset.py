"""The `dataset:` section: N2 negatives, the leak-free split and the export (§3.3–3.4)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from cpr_ray.sections import Count
from cpr_ray.sections import Section as _Section


def license_code(name: str) -> str:
    """A licence as ingest stores it (`abstract_license`): letters and digits upper-cased,
    public domain as PD, so `cc-by`, `CC BY` and `CCBY` are one licence."""
    code = re.sub(r"[^A-Za-z0-9]", "", name).upper()
    return "PD" if code == "PUBLICDOMAIN" else code


class DatasetConfig(_Section):
    """N2 negatives, the leak-free split and the export (§3.3–3.4)."""

    eval_per_field: Count = Field(50, description="CPR-eval queries per field.")
    eval_negatives_per_group: Count = Field(
        50, description="Negatives kept per candidate group for an eval query."
    )
    train_negatives_per_group: int = Field(
        3, ge=0, description="Negatives kept per candidate group for a train query."
    )
    max_negative_usefulness: int = Field(
        1, ge=0, le=3, description="A candidate is a negative when it scores at most this."
    )
    negatives_margin: float = Field(
        0.2,
        ge=0,
        le=10,
        description="Candidates judged beyond the negatives still missing in a group, as a "
        "share of them (rounded up): one round usually fills a group, and a group walks on "
        "in further rounds only when false negatives ate the margin.",
    )
    seed: int = Field(0, description="Seed of the split.")
    open_licenses: tuple[str, ...] = Field(
        ("CC-BY", "CC0", "public-domain"),
        description="Abstract licences that allow redistribution: the export carries these "
        "abstracts and only ids for the rest (`cpr hydrate` fills them from the user's own S2 "
        "abstracts). Compared as letters and digits, case-insensitive.",
    )

    @field_validator("open_licenses")
    @classmethod
    def _licences_named(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        empty = [v for v in value if not license_code(v)]
        if empty:
            raise ValueError(f"licence names need letters or digits: {empty!r}")
        return value
