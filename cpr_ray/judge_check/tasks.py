"""The build's own task for each judged stage, and the label each answer reaches.

Six stages are whole task classes of a build. The seventh, `write-queries`, measures only the
review step of `QueryWriter` (P3 step 3): extraction and rewriting write text no gold label can
score, while the reviewer's accept/reject is a judgment like the others. `QueryReviewStep` runs
that step through `QueryWriter.review` — the build's prompt, answer contract and call.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.writing import QueryWriter, citing_paper


class QueryReviewStep(LLMTask):
    """The reviewer of `QueryWriter` alone, on a written problem and query. `derive` adds
    `accept` (every review boolean true) and `fails` (the ones that are false)."""

    stage = "write-queries"
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


def make_task(stage: str, hold_out_flagged: bool = True) -> LLMTask:
    """The build's own task for a judged stage."""
    from cpr_ray.dataset.negatives import NegativeGrader
    from cpr_ray.queries.dedup import SameProblemJudge, StrongestAnalogyJudge
    from cpr_ray.queries.judges import AnalogyJudge, TransferVerifier
    from cpr_ray.queries.usefulness import UsefulnessGrader

    if stage == "judge-analogy":
        return AnalogyJudge(hold_out_flagged=hold_out_flagged)
    tasks: dict[str, type[LLMTask]] = {
        "judge-transfer": TransferVerifier,
        "write-queries": QueryReviewStep,
        "dedup": SameProblemJudge,
        "strongest": StrongestAnalogyJudge,
        "score-positives": UsefulnessGrader,
        "judge-negatives": NegativeGrader,
    }
    if stage not in tasks:
        raise ValueError(f"not a judged stage: {stage}")
    return tasks[stage]()


def judged_label(stage: str, row: dict[str, Any]) -> Any:
    """The label a derived row reached, in the gold's terms (None: no usable answer)."""
    if row["status"] != "ok":
        return None
    if stage == "judge-analogy":
        return row.get("decision")
    if stage == "judge-transfer":
        return "transfer" if row.get("verdict") == "transfer" else row.get("reject_reason")
    if stage == "write-queries":
        return None if row.get("accept") is None else ("accept" if row["accept"] else "reject")
    if stage == "dedup":
        same = row.get("same_problem")
        return None if same is None else ("same" if same else "different")
    if stage == "strongest":
        # the index only where it names a candidate (`model_choice`), as a build reads it
        return row.get("strongest_index") if row.get("model_choice") is not None else None
    return row.get("usefulness")
