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
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.judges import format_mappings, format_relations


class Usefulness(_Answer):
    """The method's grader answers the final score alone, with no written reasoning (B.5)."""

    score: int = Field(ge=0, le=3, description="0-3: how usable the passage is for the problem.")


# a usefulness of 2 or more is usable (B.5): positives keep it, negatives (N2) must stay below it
KEEP_USEFULNESS = 2

# Only a positive's grader gets the first judge's mappings (B.5); a negative's gets no block at
# all (B.6), not an empty one, so nothing hints that a mapping was ever expected.
REFERENCE_NOTE = (
    "After the passage come object mappings and shared relations that an earlier judge proposed "
    "between the question's problem and the passage. They are an optional reference: use one "
    "only where its left side matches the question and its right side the passage."
)

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
    carry `mappings`: a positive's reference block (`grader_reference`), null for a negative."""

    stage = "score-positives"
    prompts = (prompts.load("usefulness", "v2"),)
    key_columns = ("query", "passage", "mappings")
    output_schema = pa.schema([("usefulness", pa.int8())])

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        reference = row["mappings"] or ""
        prompt = self.prompts[0].render(
            query=row["query"],
            passage=row["passage"],
            reference_note=REFERENCE_NOTE if reference else "",
            reference=reference,
        )
        out = await client.ask(
            self.stage, prompt, Usefulness, usage=usage, fallback=parse_usefulness_text
        )
        if out.value is None:
            return self.empty_output(), out.status, out.error
        return {"usefulness": out.value.score}, "ok", None
