"""The `mining:` section: top venues, base papers and cross-topic pairs (§3.2 P1)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cpr_ray.sections import Count, Positive
from cpr_ray.sections import Section as _Section


class MiningConfig(_Section):
    top_share: Positive = Field(
        0.2, le=1, description="Share of each field's venues kept, by 2-year mean citedness."
    )
    min_venue_papers: Count = Field(
        20, description="Papers a venue needs in the corpus to be ranked at all."
    )
    conference_policy: Literal["rank_separately", "pool", "exclude"] = Field(
        "rank_separately",
        description="Conference citedness runs low: rank conferences among the conferences of "
        "their field (rank_separately), with the journals (pool), or drop them (exclude).",
    )
    year_min: int = Field(2010, ge=1900, description="First publication year of base papers.")
    year_max: int = Field(2025, ge=1900, description="Last publication year of base papers.")
    base_per_field: Count | None = Field(
        None,
        description="Base papers drawn per field. Unset: as many as the smallest non-empty field "
        "has, so every field gets the same count (collects all eligible ids: set it on a big "
        "corpus).",
    )
    base_requires_context: bool = Field(
        True,
        description="Base papers need at least one citation with a citing sentence (S2 contexts "
        "or recovered from S2ORC full text).",
    )
    keep_pairs_without_context: bool = Field(
        False,
        description="Keep pairs with no citing sentence (flagged has_context=false). The method "
        "builds from papers with full text: the analogy judge reads how q cites d, so by default "
        "such pairs are dropped (and counted).",
    )
    seed: int = Field(0, description="Seed of the per-field sampling order.")

    @model_validator(mode="after")
    def _years_in_order(self) -> MiningConfig:
        if self.year_min > self.year_max:
            raise ValueError(f"year_min {self.year_min} is after year_max {self.year_max}")
        return self
