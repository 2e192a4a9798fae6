"""Usefulness grading (B.5 for positives, B.6/N2 for negatives): could the passage
(`schemas.passages`: the title and the abstract cut at 2,000 characters) be used to solve the
query's problem, 0–3. Its answer contract and the grader."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.prompts import Prompt
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.judges import format_mappings, format_relations
from cpr_ray.stages import SCORE_POSITIVES


class Usefulness(_Answer):
    """The method's grader answers the final score alone, with no written reasoning (B.5)."""

    score: int = Field(ge=0, le=3, description="0-3: how usable the passage is for the problem.")


# a usefulness of 2 or more is usable (B.5): positives keep it, negatives (N2) must stay below it
KEEP_USEFULNESS = 2

_FINAL_SCORE = re.compile(r"(?:score|final)[^0-9]{0,20}([0-3])(?!\d)", re.I)


def parse_usefulness_text(text: str) -> Usefulness | None:
    """A grader that ignored the JSON form still ends with its score: take the last one."""
    found = _FINAL_SCORE.findall(text)
    if not found:
        tail = re.findall(r"(?<!\d)([0-3])(?!\d)", text[-40:])
        found = tail
    return Usefulness(score=int(found[-1])) if found else None


def grader_reference(
    mappings: list[dict[str, Any]] | None, relations: list[dict[str, Any]] | None
) -> str:
    """A positive's reference block: the first judge's mappings and shared relations."""
    return (
        f"Mappings: {format_mappings(mappings) or '(none)'}\n"
        f"Shared relations: {format_relations(relations) or '(none)'}"
    )


class UsefulnessGrader(LLMTask):
    """B.5 (and N2 later): could the passage be used to solve the query's problem? 0–3. Rows
    carry `mappings`: a positive's reference block (`grader_reference`), null for a negative.

    Only a positive's grader gets the mappings (B.5), introduced by a neutral note (its own
    prompt file, so its wording is versioned like any prompt's): a candidate correspondence,
    which may not apply, never an earlier judge's word. A negative's gets no block and no note
    (B.6), not an empty one, so nothing hints that a mapping was ever expected."""

    stage = SCORE_POSITIVES
    prompts: tuple[Prompt, ...] = (
        prompts.load("usefulness", "v2"),
        prompts.load("usefulness_reference", "v1"),
    )
    key_columns = ("query", "passage", "mappings")
    prefix_columns = ("query",)
    output_schema = pa.schema([("usefulness", pa.int8())])

    @staticmethod
    def gold_label(row: dict[str, Any]) -> Any:
        return row.get("usefulness")

    def render(self, row: dict[str, Any]) -> str:
        reference = row["mappings"] or ""
        return self.prompts[0].render(
            query=row["query"],
            passage=row["passage"],
            reference_note=self.prompts[1].template.strip() if reference else "",
            reference=reference,
        )

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        out = await client.ask(
            self.stage, self.render(row), Usefulness, usage=usage, fallback=parse_usefulness_text
        )
        if out.value is None:
            return self.empty_output(), out.status, out.error
        return {"usefulness": out.value.score}, "ok", None
