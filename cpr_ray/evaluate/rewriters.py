"""The LLM query rewriters of evaluation (HyDE, Query2doc, RAG-Fusion) with their answer
contracts; a rewrite batch is one table through `run_llm_task` (cache, ledger, retries), kept
under `eval.llm_root` like the reranker's calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.config import Config
from cpr_ray.errors import ConfigError
from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.runner import LLMTask, endpoint_url, run_llm_task
from cpr_ray.ray_runtime import ensure_ray
from cpr_ray.retrieval.llm_judge import EVAL_STEPS, eval_context

FEW_SHOT = 4


class Passage(_Answer):
    passage: str = Field(max_length=2000)


class Queries(_Answer):
    queries: list[str] = Field(min_length=4, max_length=4)


class RewriteTask(LLMTask):
    stage = "rewrite"
    key_columns = ("kind", "query", "examples")

    def __init__(self, kind: str) -> None:
        name = {"hyde": "hyde", "query2doc": "query2doc", "rag-fusion": "rag_fusion"}[kind]
        self.kind = kind
        self.prompts = (prompts.load(name),)
        self.output_schema = pa.schema([("rewritten", pa.list_(pa.string()))])

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        text = self.prompts[0].render(query=row["query"], examples=row["examples"] or "")
        if self.kind == "rag-fusion":
            out = await client.ask(self.stage, text, Queries, usage=usage)
            value = [row["query"], *out.value.queries] if out.value else None
        else:
            out = await client.ask(self.stage, text, Passage, usage=usage)
            # HyDE searches with the imagined passage; Query2doc with query + passage
            value = (
                None
                if out.value is None
                else [
                    out.value.passage
                    if self.kind == "hyde"
                    else f"{row['query']} {out.value.passage}"
                ]
            )
        if value is None:
            return {"rewritten": None}, out.status, out.error
        return {"rewritten": value}, "ok", None


class LLMQueryRewriter:
    def __init__(self, kind: str, cfg: Config, train_pairs: Sequence[tuple[str, str]]) -> None:
        self.name = kind
        self.base_url = endpoint_url(cfg.llm, EVAL_STEPS)  # fail before starting anything
        self.ctx = eval_context(cfg)
        self.examples = (
            "\n\n".join(f"Question: {q}\nPassage: {p[:600]}" for q, p in train_pairs[:FEW_SHOT])
            if kind == "query2doc"
            else ""
        )
        if kind == "query2doc" and not train_pairs:
            raise ConfigError(
                "query2doc needs train pairs for its few-shot examples; this benchmark has none"
            )
        ensure_ray(cfg.ray)

    def rewrite(self, queries: Sequence[str]) -> list[str | list[str]]:
        rows = pa.table(
            {
                "kind": [self.name] * len(queries),
                "query": list(queries),
                "examples": [self.examples] * len(queries),
            }
        )
        out = run_llm_task(self.ctx, RewriteTask(self.name), rows, base_url=self.base_url)
        result: list[str | list[str]] = []
        for query, row in zip(queries, out.table.to_pylist(), strict=True):
            texts = row["rewritten"] if row["status"] == "ok" else None
            if not texts:  # a failed rewrite falls back to the plain query, counted in the ledger
                result.append(query)
            else:
                result.append(texts if self.name == "rag-fusion" else texts[0])
        return result


def query_rewriter(
    kind: str, cfg: Config, train_pairs: Sequence[tuple[str, str]]
) -> LLMQueryRewriter:
    return LLMQueryRewriter(kind, cfg, train_pairs)
