"""The build's own task for each gold set, and the label each answer reaches: the registry
(`cpr_ray.stages`) names the task each gold set measures, and the task says its label.

Six gold sets measure whole task classes of a build. The seventh, `write-queries`, measures
only the review step of `QueryWriter` (P3 step 3): extraction and rewriting write text no gold
label can score, while the reviewer's accept/reject is a judgment like the others.
`QueryReviewStep` runs that step through `QueryWriter.review` — the build's prompt, answer
contract and call.
"""

from __future__ import annotations

import inspect
from typing import Any

import pyarrow as pa

from cpr_ray import stages as registry
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.writing import QueryWriter, citing_paper
from cpr_ray.stages import WRITE_QUERIES


class QueryReviewStep(LLMTask):
    """The reviewer of `QueryWriter` alone, on a written problem and query. `derive` adds
    `accept` (every review boolean true) and `fails` (the ones that are false)."""

    stage = WRITE_QUERIES
    key_columns = ("q_title", "q_abstract", "contexts", "problem", "query")
    output_schema = pa.schema(
        [
            ("review_problem_only", pa.bool_()),
            ("review_grounded", pa.bool_()),
            ("review_well_formed", pa.bool_()),
            ("review_issue", pa.string()),
        ]
    )

    prompts = (QueryWriter.prompts[2],)
    prefix_columns = QueryWriter.prefix_columns

    def __init__(self) -> None:
        self.writer = QueryWriter()

    def derive(self, table: pa.Table) -> pa.Table:
        names = ("problem_only", "grounded", "well_formed")
        accept: list[bool | None] = []
        fails: list[list[str] | None] = []
        for row in table.to_pylist():
            if row["status"] != "ok":
                accept.append(None)
                fails.append(None)
                continue
            failed = [n for n in names if not row[f"review_{n}"]]
            accept.append(not failed)
            fails.append(failed)
        return table.append_column("accept", pa.array(accept, pa.bool_())).append_column(
            "fails", pa.array(fails, pa.list_(pa.string()))
        )

    @staticmethod
    def gold_label(row: dict[str, Any]) -> Any:
        return None if row.get("accept") is None else ("accept" if row["accept"] else "reject")

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        out = await self.writer.review(
            client, citing_paper(row), row["problem"], row["query"], usage
        )
        if out.value is None:
            return self.empty_output(), out.status, out.error
        return (
            {
                "review_problem_only": out.value.problem_only,
                "review_grounded": out.value.grounded,
                "review_well_formed": out.value.well_formed,
                "review_issue": out.value.issue,
            },
            "ok",
            None,
        )


def task_class(gold: str) -> type[LLMTask]:
    """The build's task class a gold set measures (`cpr_ray.stages`)."""
    if gold not in registry.GOLD:
        raise ValueError(f"not a judged stage: {gold}")
    cls: type[LLMTask] = registry.resolve(registry.GOLD[gold].cls)
    return cls


def make_task(stage: str, hold_out_flagged: bool = True) -> LLMTask:
    """The build's own task for a gold set, with the build's `llm.hold_out_flagged_inputs`
    where the task takes it (the analogy judge)."""
    cls = task_class(stage)
    if "hold_out_flagged" in inspect.signature(cls).parameters:
        return cls(hold_out_flagged=hold_out_flagged)  # type: ignore[call-arg]
    return cls()


def judged_label(stage: str, row: dict[str, Any]) -> Any:
    """The label a derived row reached, in the gold's terms (None: no usable answer)."""
    return None if row["status"] != "ok" else task_class(stage).gold_label(row)
