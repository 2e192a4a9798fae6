"""The `input:` section: where the bulk Semantic Scholar and OpenAlex exports are."""

from __future__ import annotations

from pydantic import Field

from cpr_ray.sections import Section as _Section


class InputConfig(_Section):
    s2: str = Field(
        description="URI of the Semantic Scholar bulk export: one folder per dataset "
        "(papers/, abstracts/, citations/, publication-venues/, optional s2orc/) of "
        "gzipped JSONL shards."
    )
    openalex: str = Field(
        description="URI of the OpenAlex snapshot: works/ and sources/ folders of gzipped "
        "JSONL (updated_date=…/part_….gz, as in OpenAlex's own snapshot layout)."
    )
    openalex_snapshot: str | None = Field(
        None,
        description="Label of the OpenAlex snapshot the topics come from (recorded in the "
        "build). Unset: the newest updated_date=… partition found under works/.",
    )
