"""The `refresh:` section: the nightly refresh from Semantic Scholar's diffs."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from cpr_ray.sections import Positive
from cpr_ray.sections import Section as _Section


class RefreshConfig(_Section):
    """The nightly refresh from Semantic Scholar's incremental diffs (`cpr refresh`)."""

    operational: ClassVar[frozenset[str]] = frozenset(
        {
            "api_url",
            "api_key_env",
            "requests_per_second",
            "max_retries",
            "timeout_s",
            "task_memory_mb",
        }
    )

    base_release: str | None = Field(
        None,
        description="The S2 release the bulk shards under input.s2 are (e.g. 2026-11-25): where "
        "the first refresh starts. Later refreshes start from the release they applied last.",
    )
    api_url: str = Field(
        "https://api.semanticscholar.org/datasets/v1",
        description="Semantic Scholar Datasets API base URL.",
    )
    api_key_env: str = Field(
        "S2_API_KEY",
        description="Environment variable holding the API key (sent as x-api-key, never logged).",
    )
    datasets: tuple[Literal["papers", "abstracts", "citations"], ...] = Field(
        ("papers", "abstracts", "citations"), description="Datasets whose diffs are applied."
    )
    requests_per_second: Positive = Field(
        1.0, description="API request rate; S2 allows 1/s per key."
    )
    max_retries: int = Field(5, ge=0, description="Retries of a 429/5xx/unreachable request.")
    timeout_s: Positive = Field(120.0, description="Seconds per HTTP request.")
    downstream: bool = Field(
        True,
        description="After the corpus, rerun the build's later stages (they pay only for what "
        "changed); false applies the diffs only.",
    )
    incremental: bool = Field(
        True,
        description="The later stages reuse what the last run computed for every row the diff "
        "does not reach (mined rows, LLM answers, vectors, candidate lists) and compute only the "
        "rows it reaches; the result equals a full rerun's. false recomputes every row (a "
        "build's cost), e.g. to check a refresh against one.",
    )
    rebucket_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Rewrite a corpus table into its key-bucket fragments (which also compacts "
        "it) once fragments that mix buckets (appended by refreshes of earlier versions; a "
        "refresh now writes one bucket per fragment), which every mining bucket scans, hold "
        "more than this share of its rows; 0: after every refresh, 1: never.",
    )
    task_memory_mb: int = Field(
        2048,
        gt=0,
        description="Memory each refresh task declares to Ray: one diff file fetched and parsed "
        "a batch (ingest.batch_size lines) at a time, or one key bucket's share of a release "
        "step applied (with, after a new OpenAlex partition, its papers' keys and one key "
        "bucket of the partition's).",
    )
    retain_versions_days: float = Field(
        7.0,
        ge=0,
        description="Corpus table versions older than this are removed after a refresh (never "
        "while a build holds a live lease on the build root).",
    )

    @field_validator("base_release", mode="before")
    @classmethod
    def _release_id(cls, value: Any) -> Any:
        """YAML reads an unquoted 2026-11-25 as a date; S2 release ids are strings."""
        return value.isoformat() if isinstance(value, dt.date) else value
