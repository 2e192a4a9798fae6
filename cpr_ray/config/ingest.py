"""The `ingest:` section: how the bulk exports become the corpus tables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cpr_ray.sections import Count, Positive
from cpr_ray.sections import Section as _Section


class IngestConfig(_Section):
    num_buckets: Count = Field(
        8,
        le=65536,
        description="Key buckets for the join (papers, works and citations are hash-partitioned "
        "so matching buckets join locally with no shuffle). Aim for buckets of ~1-4M rows.",
    )
    batch_size: int = Field(20_000, ge=100, description="Lines parsed per batch.")
    cpus_per_task: Positive = Field(1.0, description="CPUs each parse/join task reserves.")
    parse_buffer_mb: Count = Field(
        256,
        description="MiB of parsed rows a parse task holds before it writes them, one Parquet "
        "file per key bucket (so files of ~parse_buffer_mb/(num_buckets+2) MiB; at least 1 MiB "
        "each); a batch of lines is also cut at 1/8 of it (1/32 for long lines). Bounds the "
        "task's memory whatever the shard size: it declares 576 MiB + 2x this to Ray.",
    )
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

    @model_validator(mode="after")
    def _bucket_files_not_tiny(self) -> IngestConfig:
        # a flush writes one file per bucket: a smaller buffer means millions of tiny files
        if self.parse_buffer_mb < self.num_buckets + 2:
            raise ValueError(
                f"parse_buffer_mb={self.parse_buffer_mb} with num_buckets={self.num_buckets} "
                "would write staging files under 1 MiB; set parse_buffer_mb to at least "
                f"{self.num_buckets + 2} or use fewer buckets"
            )
        return self
