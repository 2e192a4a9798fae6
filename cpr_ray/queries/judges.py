"""The judging steps over (q, d) pairs: analogy (B.1) and transfer verification (B.2).

The stage `judge-transfer` must be asked of a second, different model (`llm.stages.judge-transfer.
model`): the config refuses one equal to the analogy judge's unless `llm.allow_same_verifier`."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cpr_ray.llm import prompts
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.injection import input_flags
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.analogy import (
    EXCLUSIONS,
    AnalogyJudgment,
    TransferVerdict,
    analogy_decision,
    analogy_passed,
    analogy_problems,
    analogy_record,
    transfer_problems,
    transfer_verified,
)
from cpr_ray.stages import JUDGE_ANALOGY, JUDGE_TRANSFER

MAPPING = pa.struct([("q_object", pa.string()), ("d_object", pa.string()), ("role", pa.string())])
RELATION = pa.struct(
    [
        ("predicate", pa.string()),
        ("q_arguments", pa.list_(pa.string())),
        ("d_arguments", pa.list_(pa.string())),
    ]
)
PATH = pa.struct(
    [("from_d", pa.string()), ("through_mappings", pa.string()), ("helps_q", pa.string())]
)
# what others wrote about a pair, where an injection would hide (topics are OpenAlex's names)
PAIR_TEXT_COLUMNS = ("q_title", "q_abstract", "contexts", "d_title", "d_abstract")


def format_contexts(contexts: list[str] | None) -> str:
    if not contexts:
        return "(no citing sentence is available)"
    return "\n".join(f"{i}. {c}" for i, c in enumerate(contexts, 1))


def pair_texts(row: dict[str, Any]) -> dict[str, str]:
    """The texts of a (q, d) pair that every judge reads."""
    return {
        "q_title": row["q_title"] or "",
        "q_abstract": row["q_abstract"] or "",
        "contexts": format_contexts(row["contexts"]),
        "d_title": row["d_title"] or "",
        "d_abstract": row["d_abstract"] or "",
    }


def format_mappings(mappings: list[dict[str, Any]] | None) -> str:
    return "; ".join(f"{m['q_object']} -> {m['d_object']} ({m['role']})" for m in mappings or [])


def stated_relations(j: AnalogyJudgment) -> list[dict[str, Any]]:
    """The relations as every later reader takes them (RELATION): the predicate over the q
    objects and over the d objects of the mappings the answer numbered."""
    out = []
    for rel in j.shared_relations:
        q_args, d_args = rel.sides(j.object_mappings)
        out.append({"predicate": rel.predicate, "q_arguments": q_args, "d_arguments": d_args})
    return out


def format_transfer_path(path: dict[str, Any] | None) -> str:
    """The three parts of a transfer path as one line (empty parts left out)."""
    parts = (
        ("from D", (path or {}).get("from_d")),
        ("through the mappings", (path or {}).get("through_mappings")),
        ("for Q", (path or {}).get("helps_q")),
    )
    return "; ".join(f"{label}: {text.strip()}" for label, text in parts if text and text.strip())


def format_relations(relations: list[dict[str, Any]] | None) -> str:
    return "; ".join(
        f"{r['predicate']}({', '.join(r['q_arguments'])}) ~ "
        f"{r['predicate']}({', '.join(r['d_arguments'])})"
        for r in relations or []
    )


class AnalogyJudge(LLMTask):
    """B.1: mappings, relations and a decision; passes on observed or potential analogy.

    The cache keeps the model's answer (its own decision as `model_decision`); `derive` adds the
    decision the booleans imply, empties an excluded pair's mappings and relations, and adds the
    pair's `input_flags` and `passed`, on every read.
    """

    stage = JUDGE_ANALOGY
    prompts = (prompts.load("analogy", "v4"),)
    prefix_columns = ("q_title", "q_abstract", "q_topic")
    key_columns = (
        "base_id",
        "cited_id",
        "q_title",
        "q_abstract",
        "q_topic",
        "d_title",
        "d_abstract",
        "d_topic",
        "contexts",
    )
    output_schema = pa.schema(
        [
            ("same_problem", pa.bool_()),
            ("exclusions", pa.list_(pa.string())),  # same_problem first, then EXCLUSIONS' order
            ("object_mappings", pa.list_(MAPPING)),
            ("shared_relations", pa.list_(RELATION)),
            ("structural_analogy", pa.bool_()),
            ("transfer_holds", pa.bool_()),
            ("transferable", pa.bool_()),
            ("transfer_type", pa.string()),
            ("transfer_path", PATH),
            ("reason", pa.string()),
            ("model_decision", pa.string()),
        ]
    )

    def __init__(self, *, hold_out_flagged: bool = True) -> None:
        self.hold_out_flagged = hold_out_flagged

    def derive(self, table: pa.Table) -> pa.Table:
        """`decision` from the booleans (never the model's word alone), the mappings and
        relations of an excluded pair dropped (`analogy_record`), `input_flags` from the pair's
        texts, and `passed` (see `analogy_passed`)."""
        table = analogy_record(table).append_column("decision", analogy_decision(table))
        table = table.append_column("input_flags", input_flags(table, PAIR_TEXT_COLUMNS))
        return table.append_column(
            "passed", analogy_passed(table, hold_out_flagged=self.hold_out_flagged)
        )

    @staticmethod
    def gold_label(row: dict[str, Any]) -> Any:
        return row.get("decision")

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        prompt = self.prompts[0].render(
            **pair_texts(row), q_topic=row["q_topic"] or "", d_topic=row["d_topic"] or ""
        )
        out = await client.ask(
            self.stage, prompt, AnalogyJudgment, usage=usage, check=analogy_problems
        )
        if out.value is None:
            return self.empty_output(), out.status, out.error
        j = out.value
        answer = j.model_dump(exclude={"decision", "shared_relations", *EXCLUSIONS})
        return (
            {
                **answer,
                "shared_relations": stated_relations(j),
                "exclusions": j.exclusions,
                "model_decision": j.decision,
            },
            "ok",
            None,
        )


class TransferVerifier(LLMTask):
    """B.2: a second model checks the first judgment against the texts; `derive` adds
    `verified`."""

    stage = JUDGE_TRANSFER
    prompts = (prompts.load("transfer", "v4"),)
    prefix_columns = ("q_title", "q_abstract")
    key_columns = (
        "base_id",
        "cited_id",
        "q_title",
        "q_abstract",
        "d_title",
        "d_abstract",
        "contexts",
        "decision",
        "transfer_type",
        "object_mappings",
        "shared_relations",
        "transfer_path",
        "reason",
    )
    output_schema = pa.schema(
        [
            ("verdict", pa.string()),
            ("reject_reason", pa.string()),
            ("verify_reason", pa.string()),
        ]
    )

    def derive(self, table: pa.Table) -> pa.Table:
        """`verified` from the cached verdict, so a changed rule needs no new call."""
        return table.append_column("verified", transfer_verified(table))

    @staticmethod
    def gold_label(row: dict[str, Any]) -> Any:
        """A transfer, or the reason it was rejected."""
        return "transfer" if row.get("verdict") == "transfer" else row.get("reject_reason")

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        prompt = self.prompts[0].render(
            **pair_texts(row),
            decision=row["decision"],
            transfer_type=row["transfer_type"],
            mappings=format_mappings(row["object_mappings"]),
            relations=format_relations(row["shared_relations"]),
            transfer_path=format_transfer_path(row["transfer_path"]),
            reason=row["reason"] or "",
        )
        out = await client.ask(
            self.stage, prompt, TransferVerdict, usage=usage, check=transfer_problems
        )
        if out.value is None:
            return self.empty_output(), out.status, out.error
        v = out.value
        return (
            {"verdict": v.verdict, "reject_reason": v.reject_reason, "verify_reason": v.reason},
            "ok",
            None,
        )
