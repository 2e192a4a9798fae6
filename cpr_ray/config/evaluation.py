"""The `eval:` section: one evaluation run (`cpr eval`)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from cpr_ray.sections import Count, Positive
from cpr_ray.sections import Section as _Section

Benchmark = Literal["cpr", "cpr-full", "beir", "analobench", "bright"]
RetrieverName = Literal["bm25", "dense", "splade", "hybrid"]
RewriteKind = Literal["hyde", "query2doc", "rag-fusion"]
SearchBackend = Literal["numpy", "faiss"]


class EvalConfig(_Section):
    """One evaluation run: the `cpr eval` flags are shortcuts for these keys."""

    benchmark: Benchmark | None = Field(None, description="Benchmark to evaluate on (--benchmark).")
    data: str | None = Field(None, description="URI of the benchmark's files (path or s3://…).")
    subset: str | None = Field(
        None,
        description="CPR: split table (cpr-eval); BEIR: qrels split (test); AnaloBench: t2, "
        "t2-stories-10, t2-stories-30, t1, t1-stories-10, t1-stories-30; BRIGHT: "
        "comma-separated subsets (default: the StackExchange ones).",
    )
    variant: str = Field(
        "full",
        description="Label of the data variant (e.g. a pool rebuilt without one pooler), so "
        "`cpr report` can compare retriever orders across variants.",
    )
    retriever: RetrieverName | None = Field(None, description="Retriever (--retriever).")
    search_backend: SearchBackend = Field(
        "numpy", description="Exact search in NumPy, or a faiss index (faiss_index)."
    )
    faiss_index: str = Field("Flat", description="faiss index_factory string (Flat is exact).")
    ray_min_docs: int = Field(
        20_000, ge=0, description="Encode on a Ray Data actor pool from this many documents."
    )
    top_k: int = Field(100, ge=10, description="Depth of full-corpus search.")
    rerank: Literal["llm"] | None = Field(None, description="llm: the tournament reranker.")
    rerank_depth: int | None = Field(
        None, ge=2, description="Candidates reranked per query; unset: the whole pool / top_k."
    )
    tournament_rounds: str = Field(
        "25:30,15:10",
        description="Listwise rounds as group_size:survivors, comma-separated; the last "
        "round's survivors are scored pointwise.",
    )
    rerank_workers: Count = Field(8, description="Queries reranked concurrently.")
    rewrite: RewriteKind | None = Field(None, description="Query rewriter before retrieval.")
    fusion_k: int = Field(60, ge=0, description="k of reciprocal rank fusion (RAG-Fusion, HyDE).")
    fusion_include_original: bool = Field(
        True, description="RAG-Fusion also ranks with the original query (once)."
    )
    hyde_passages: Count = Field(
        4,
        le=16,
        description="Passages HyDE writes per query (one call); their rankings are fused "
        "by reciprocal rank fusion.",
    )
    seed: int = Field(0, description="Seeds tie-breaking, bootstrap and AnaloBench T1 items.")
    resamples: Count = Field(2000, description="Bootstrap resamples.")
    confidence: Positive = Field(0.95, lt=1, description="Bootstrap interval coverage.")
    gain: Literal["exponential", "linear"] = Field(
        "exponential", description="nDCG gain: 2^rel - 1, or rel (trec_eval, BEIR tables)."
    )
    robustness: bool = Field(True, description="Add the same-topic-removed block (CPR-eval).")
    out: str | None = Field(None, description="Results JSON file, or a folder to write it in.")
    llm_root: str = Field(
        "~/.cache/cpr-ray/eval-llm",
        description="Where the reranker's and rewriters' LLM cache and ledger live (a path or "
        "s3://…), so a rerun pays nothing; `cpr stats` on it shows the spend.",
    )

    @field_validator("tournament_rounds")
    @classmethod
    def _rounds(cls, v: str) -> str:
        for part in v.split(","):
            if not re.fullmatch(r"\s*\d+\s*:\s*\d+\s*", part):
                raise ValueError(f"tournament round {part!r} must look like group_size:survivors")
        return v
