"""Usefulness grading (B.5 for positives, B.6/N2 for negatives): could the passage
(`schemas.passages`: the one paper text, cut at 2,000 characters) be used to solve the query's
problem, 0–3. Its answer contract and the grader."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.runner import LLMTask


class Usefulness(_Answer):
    reasoning: str = Field(max_length=600, description="Brief: intent match and trustworthiness.")
    score: int = Field(ge=0, le=3)


# a usefulness of 2 or more is usable (B.5): positives keep it, negatives (N2) must stay below it
KEEP_USEFULNESS = 2


_FINAL_SCORE = re.compile(r"(?:score|final)[^0-9]{0,20}([0-3])(?!\d)", re.I)


def parse_usefulness_text(text: str) -> Usefulness | None:
    """A grader that ignored the JSON form still ends with its score: take the last one."""
    found = _FINAL_SCORE.findall(text)
    if not found:
        tail = re.findall(r"(?<!\d)([0-3])(?!\d)", text[-40:])
        found = tail
    return Usefulness(reasoning=text.strip()[:600], score=int(found[-1])) if found else None


class UsefulnessGrader(LLMTask):
    """B.5 (and N2 later): could the passage be used to solve the query's problem? 0–3."""

    stage = "score-positives"
    prompts = (prompts.load("usefulness"),)
    key_columns = ("query", "passage", "mappings")
    output_schema = pa.schema([("usefulness", pa.int8()), ("usefulness_reasoning", pa.string())])

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        prompt = self.prompts[0].render(
            query=row["query"], passage=row["passage"], mappings=row["mappings"] or "(none)"
        )
        out = await client.ask(
            self.stage, prompt, Usefulness, usage=usage, fallback=parse_usefulness_text
        )
        if out.value is None:
            return self.empty_output(), out.status, out.error
        return (
            {"usefulness": out.value.score, "usefulness_reasoning": out.value.reasoning},
            "ok",
            None,
        )
