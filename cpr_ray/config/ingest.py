"""The `ingest:` section: how the bulk exports become the corpus tables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cpr_ray.sections import Section as _Section


class IngestConfig(_Section):
    num_buckets: int = Field(
        8,
        ge=1,
        le=65536,
        description="Key buckets for the join (papers, works and citations are hash-partitioned "
        "so matching buckets join locally with no shuffle). Aim for buckets of ~1-4M rows.",
    )
    batch_size: int = Field(20_000, ge=100, description="Lines parsed per batch.")
    cpus_per_task: float = Field(1.0, gt=0, description="CPUs each parse/join task reserves.")
    max_reject_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Fail the stage when more than this share of any input's lines is rejected "
        "(a wrong path or format, not a few bad records).",
    )
    lance_fragment_rows: int = Field(
        250_000,
        ge=1000,
        description="Rows per Lance fragment of the corpus tables: fragments are the unit of "
        "parallel reads, so a table of one fragment is scanned by one task.",
    )
    raw_line_limit: int = Field(
        20_000, ge=100, description="Characters of a rejected line kept in the rejects table."
    )
    on_corrupt_shard: Literal["fail", "quarantine"] = Field(
        "fail",
        description="A shard that cannot be read to its end (a truncated or damaged gzip): fail "
        "the stage before anything is published, naming the shard and where it broke (fail), or "
        "build without it, with the shard listed in the rejects table and counted in the "
        "statistics (quarantine; costs one more pass over that input).",
    )
