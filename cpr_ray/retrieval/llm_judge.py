"""The tournament reranker's LLM judge (evaluation's and search's): its two calls, listwise
choice and pointwise score, with their answer contracts.

Each round (every query's groups at once) is one table through `run_llm_task`, so reranking gets
the same cache (a rerun pays nothing), ledger, retries and re-asks as the build. The cache and
ledger live under `eval.llm_root` (default ~/.cache/cpr-ray/eval-llm; an s3:// URI shares them
across machines); `cpr stats` on that root shows the spend.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.config import Config
from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.step_runner import LLMContext, endpoint_url, run_llm_task
from cpr_ray.llm.task import LLMTask
from cpr_ray.runs.ray_runtime import ensure_ray
from cpr_ray.storage.store import Storage
from cpr_ray.tables.schemas import passage

CANDIDATE_CHARS = 600


class Chosen(_Answer):
    review: str = Field(max_length=800)
    ids: list[str] = Field(max_length=60)


class Score(_Answer):
    score: int = Field(ge=0, le=10)


class ChooseTask(LLMTask):
    """Listwise: the `k` candidates of a group most likely to help solve the problem.

    Prompt v2 states the task neutrally (v1 hinted that the answer may come from another field
    and that topical similarity is not enough, which tilts a reference baseline toward CPR's
    cross-topic positives)."""

    stage = "rerank-choose"
    prompts = (prompts.load("rerank_choose", "v2"),)
    key_columns = ("query", "group", "k", "texts")
    output_schema = pa.schema([("chosen", pa.list_(pa.string()))])

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        group = json.loads(row["group"])
        texts = json.loads(row["texts"])
        k = row["k"]

        def check(answer: Chosen) -> list[str]:
            ids = [i.strip() for i in answer.ids]
            unknown = [i for i in ids if i not in group]
            problems = [f"unknown ids {unknown[:5]}; use ids from the list"] if unknown else []
            if len(set(ids)) != k:
                problems.append(f"give exactly {k} distinct ids (got {len(set(ids))})")
            return problems

        listing = "\n".join(f"[{d}] {texts[d][:CANDIDATE_CHARS]}" for d in group)
        out = await client.ask(
            self.stage,
            self.prompts[0].render(query=row["query"], candidates=listing, k=str(k)),
            Chosen,
            usage=usage,
            check=check,
        )
        if out.value is None:
            return {"chosen": None}, out.status, out.error
        return {"chosen": [i.strip() for i in out.value.ids]}, "ok", None


class ScoreTask(LLMTask):
    """Pointwise: a 0-10 usefulness score of one paper for the problem (prompt v2: without
    v1's "not topical similarity" hint, for the same reason as `ChooseTask`)."""

    stage = "rerank-score"
    prompts = (prompts.load("rerank_score", "v2"),)
    key_columns = ("query", "passage")
    output_schema = pa.schema([("score", pa.int8())])

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        out = await client.ask(
            self.stage,
            self.prompts[0].render(query=row["query"], passage=row["passage"]),
            Score,
            usage=usage,
        )
        if out.value is None:
            return {"score": None}, out.status, out.error
        return {"score": out.value.score}, "ok", None


def eval_context(cfg: Config) -> LLMContext:
    """Where evaluation's and search's LLM calls keep their cache and ledger (eval.llm_root)."""
    root = os.path.expanduser(cfg.eval.llm_root)
    storage = Storage(cfg.storage.model_copy(update={"root": root}))
    return LLMContext(cfg.llm, storage, f"eval-{uuid.uuid4().hex[:8]}")


EVAL_STEPS = "the LLM reranker, rewriters and explanations"


class LLMTournamentJudge:
    """BatchTournamentJudge: a whole round of listwise choices or pointwise scores per call."""

    def __init__(self, cfg: Config, doc_texts: Mapping[str, str]) -> None:
        self.doc_texts = doc_texts
        self.base_url = endpoint_url(cfg.llm, EVAL_STEPS)  # fail before starting anything
        self.ctx = eval_context(cfg)
        ensure_ray(cfg.ray)

    def choose_many(self, requests: list[Any]) -> list[Any]:
        rows = pa.Table.from_pylist(
            [
                {
                    "query": r.query,
                    "group": json.dumps([str(d) for d in r.group]),
                    "k": r.k,
                    "texts": json.dumps({str(d): self.doc_texts.get(str(d), "") for d in r.group}),
                }
                for r in requests
            ]
        )
        out = run_llm_task(self.ctx, ChooseTask(), rows, base_url=self.base_url)
        return [
            row["chosen"] if row["status"] == "ok" else RuntimeError(row["error"])
            for row in out.table.to_pylist()
        ]

    def score_many(self, requests: list[Any]) -> list[Any]:
        rows = pa.Table.from_pylist(
            [
                {"query": r.query, "passage": passage("", self.doc_texts.get(str(r.doc), ""))}
                for r in requests
            ]
        )
        out = run_llm_task(self.ctx, ScoreTask(), rows, base_url=self.base_url)
        return [
            float(row["score"]) if row["status"] == "ok" else RuntimeError(row["error"])
            for row in out.table.to_pylist()
        ]


def tournament_judge(cfg: Config, doc_texts: Mapping[str, str]) -> LLMTournamentJudge:
    return LLMTournamentJudge(cfg, doc_texts)
