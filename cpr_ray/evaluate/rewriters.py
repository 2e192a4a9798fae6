"""The LLM query rewriters of evaluation (HyDE, Query2doc, RAG-Fusion) with their answer
contracts; a rewrite batch is one table through `run_llm_task` (cache, ledger, retries), kept
under `eval.llm_root` like the reranker's calls.

The prompts state each method's task without hints about where the answer lies (HyDE and
RAG-Fusion v2; v1 of RAG-Fusion asked to vary "the field vocabulary", which steers a reference
baseline toward CPR's cross-topic positives). What a rewriter returns is exactly what is
searched: a string, or a list whose rankings the runner fuses by reciprocal rank fusion. So
RAG-Fusion's original query is added here, once, when `eval.fusion_include_original` asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.config import Config
from cpr_ray.errors import ConfigError
from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.step_runner import endpoint_url, run_llm_task
from cpr_ray.llm.task import LLMTask
from cpr_ray.retrieval.llm_judge import EVAL_STEPS, eval_context
from cpr_ray.runs.ray_runtime import ensure_ray

FEW_SHOT = 4
PASSAGE_CHARS = 2000
MAX_HYDE_PASSAGES = 16  # eval.hyde_passages' bound

PassageText = Annotated[str, Field(max_length=PASSAGE_CHARS)]


class Passage(_Answer):
    passage: PassageText


class Passages(_Answer):
    passages: list[PassageText] = Field(min_length=1, max_length=MAX_HYDE_PASSAGES)


class Queries(_Answer):
    queries: list[str] = Field(min_length=4, max_length=4)


def passage_problems(passages: Sequence[str], n: int) -> list[str]:
    """Why a HyDE answer is not `n` usable passages: fused rankings of blank or repeated
    passages would count one imagined paper several times."""
    texts = [" ".join(p.split()).lower() for p in passages]
    problems = [] if len(texts) == n else [f"write exactly {n} passages (got {len(texts)})"]
    if any(not t for t in texts):
        problems.append("a passage is empty")
    if len(set(texts)) < len(texts):
        problems.append("two passages are the same; each must be different")
    return problems


class RewriteTask(LLMTask):
    """One rewrite per query. Answers are cached as the LLM wrote them (RAG-Fusion: its four
    queries, without the original; HyDE: its passages); `LLMQueryRewriter.rewrite` builds the
    texts to search from them, so a changed setting never needs a new question."""

    stage = "rewrite"
    key_columns: tuple[str, ...] = ("kind", "query", "examples")

    def __init__(self, kind: str, hyde_passages: int = 4) -> None:
        name = {"hyde": "hyde", "query2doc": "query2doc", "rag-fusion": "rag_fusion"}[kind]
        self.kind = kind
        self.hyde_passages = hyde_passages
        # v2: HyDE writes several passages, RAG-Fusion's wording is neutral; Query2doc is as was
        self.prompts = (prompts.load(name, "v1" if kind == "query2doc" else "v2"),)
        if kind == "hyde":  # the count is asked in the prompt, so it is part of the question
            self.key_columns = ("kind", "query", "examples", "passages")
        self.output_schema = pa.schema([("rewritten", pa.list_(pa.string()))])

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        text = self.prompts[0].render(
            query=row["query"], examples=row["examples"] or "", n=str(self.hyde_passages)
        )
        if self.kind == "rag-fusion":
            queries = await client.ask(self.stage, text, Queries, usage=usage)
            if queries.value is None:
                return {"rewritten": None}, queries.status, queries.error
            return {"rewritten": list(queries.value.queries)}, "ok", None
        if self.kind == "hyde":
            n = self.hyde_passages
            hyde = await client.ask(
                self.stage,
                text,
                Passages,
                usage=usage,
                check=lambda a: passage_problems(a.passages, n),
            )
            if hyde.value is None:
                return {"rewritten": None}, hyde.status, hyde.error
            return {"rewritten": list(hyde.value.passages)}, "ok", None
        q2d = await client.ask(self.stage, text, Passage, usage=usage)
        if q2d.value is None:
            return {"rewritten": None}, q2d.status, q2d.error
        # Query2doc searches with query + passage
        return {"rewritten": [f"{row['query']} {q2d.value.passage}"]}, "ok", None


class LLMQueryRewriter:
    """HyDE, Query2doc or RAG-Fusion through the LLM layer (`eval.llm_root`'s cache and ledger).

    HyDE writes `eval.hyde_passages` passages in one call and searches with each; the runner
    fuses their rankings by reciprocal rank fusion, as it fuses RAG-Fusion's. The HyDE paper
    averages the passages' embeddings instead, but that exists only for dense retrievers, and
    the method's best rewrite is HyDE + BM25: rank fusion treats every retriever alike. One
    call asking for distinct passages (rather than several calls) keeps them different at
    temperature 0, the default, where repeated calls would return the same passage.
    """

    def __init__(self, kind: str, cfg: Config, train_pairs: Sequence[tuple[str, str]]) -> None:
        self.name = kind
        self.base_url = endpoint_url(cfg.llm, EVAL_STEPS)  # fail before starting anything
        self.ctx = eval_context(cfg)
        self.include_original = cfg.eval.fusion_include_original
        self.hyde_passages = cfg.eval.hyde_passages
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
        """Per query, what to search: Query2doc one text, HyDE its passages, RAG-Fusion its
        queries led by the original (once, when `eval.fusion_include_original`). A failed
        rewrite falls back to the plain query (counted in the ledger)."""
        n = len(queries)
        rows = pa.table(
            {
                "kind": [self.name] * n,
                "query": list(queries),
                "examples": [self.examples] * n,
                "passages": [self.hyde_passages] * n,
            }
        )
        task = RewriteTask(self.name, self.hyde_passages)
        out = run_llm_task(self.ctx, task, rows, base_url=self.base_url)
        result: list[str | list[str]] = []
        for query, row in zip(queries, out.table.to_pylist(), strict=True):
            texts = row["rewritten"] if row["status"] == "ok" else None
            if not texts:
                result.append(query)
            elif self.name == "rag-fusion":
                result.append([query, *texts] if self.include_original else list(texts))
            elif self.name == "hyde":
                result.append(list(texts) if len(texts) > 1 else texts[0])
            else:
                result.append(texts[0])
        return result


def query_rewriter(
    kind: str, cfg: Config, train_pairs: Sequence[tuple[str, str]]
) -> LLMQueryRewriter:
    return LLMQueryRewriter(kind, cfg, train_pairs)
