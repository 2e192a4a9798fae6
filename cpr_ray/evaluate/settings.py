"""Everything one evaluation run needs, validated before any work (the `cpr eval` flags)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cpr_ray.config import LLMConfig, RayConfig, StorageConfig
from cpr_ray.evaluate.loaders import BENCHMARKS
from cpr_ray.evaluate.protocols import REWRITE_KINDS
from cpr_ray.evaluate.retrievers.base import RETRIEVERS, RetrieverOptions
from cpr_ray.evaluate.tournament import Round, TournamentSpec


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: str = Field(description=f"One of: {', '.join(BENCHMARKS)}.")
    data: str = Field(description="URI of the benchmark's files (path, file://… or s3://…).")
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
    retriever: str = Field(description=f"One of: {', '.join(RETRIEVERS)}.")
    model: str | None = Field(None, description="Model path or hub name (dense, splade).")
    pooling: str = Field("auto", description="auto (model's own config) | mean | cls | last_token")
    query_prefix: str | None = Field(None, description="Query instruction; unset: by model name.")
    doc_prefix: str | None = Field(None, description="Document prefix; unset: by model name.")
    max_length: int = Field(512, ge=8, description="Tokens encoded per text.")
    batch_size: int = Field(32, ge=1, description="Texts per encoder forward pass.")
    search_backend: Literal["numpy", "faiss"] = Field(
        "numpy", description="Exact search in NumPy, or faiss (faiss_index)."
    )
    faiss_index: str = Field("Flat", description="faiss index_factory string (Flat is exact).")
    ray_min_docs: int = Field(
        20_000, ge=0, description="Encode on a Ray Data actor pool from this many documents."
    )
    ray_max_actors: int = Field(2, ge=1, description="Encoder actors at most.")
    ray_num_gpus: float = Field(0.0, ge=0, description="GPUs per encoder actor (0 on CPU).")
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
    rerank_workers: int = Field(8, ge=1, description="Queries reranked concurrently.")
    rewrite: str | None = Field(None, description=f"One of: {', '.join(REWRITE_KINDS)}.")
    fusion_k: int = Field(60, ge=0, description="k of reciprocal rank fusion (RAG-Fusion).")
    fusion_include_original: bool = Field(
        True, description="RAG-Fusion also ranks with the original query."
    )
    seed: int = Field(0, description="Seeds tie-breaking, bootstrap and AnaloBench T1 items.")
    resamples: int = Field(2000, ge=1, description="Bootstrap resamples.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Bootstrap interval coverage.")
    gain: Literal["exponential", "linear"] = Field(
        "exponential", description="nDCG gain: 2^rel - 1, or rel (trec_eval, BEIR tables)."
    )
    robustness: bool = Field(True, description="Add the same-topic-removed block (CPR-eval).")
    out: str | None = Field(None, description="Results JSON file, or a folder to write it in.")
    s3_endpoint: str | None = Field(None, description="S3-compatible endpoint override.")
    ray: RayConfig = RayConfig()
    llm: LLMConfig = LLMConfig()

    @field_validator("benchmark")
    @classmethod
    def _benchmark(cls, v: str) -> str:
        if v not in BENCHMARKS:
            raise ValueError(f"unknown benchmark {v!r}; known: {', '.join(BENCHMARKS)}")
        return v

    @field_validator("retriever")
    @classmethod
    def _retriever(cls, v: str) -> str:
        if v not in RETRIEVERS:
            raise ValueError(f"unknown retriever {v!r}; known: {', '.join(RETRIEVERS)}")
        return v

    @field_validator("rewrite")
    @classmethod
    def _rewrite(cls, v: str | None) -> str | None:
        if v is not None and v not in REWRITE_KINDS:
            raise ValueError(f"unknown rewrite {v!r}; known: {', '.join(REWRITE_KINDS)}")
        return v

    @field_validator("tournament_rounds")
    @classmethod
    def _rounds(cls, v: str) -> str:
        cls.parse_rounds(v)
        return v

    @model_validator(mode="after")
    def _model_fits(self) -> EvalSettings:
        if self.retriever == "bm25" and self.model:
            raise ValueError("bm25 takes no model")
        return self

    @staticmethod
    def parse_rounds(text: str) -> TournamentSpec:
        rounds = []
        for part in text.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", part)
            if not m:
                raise ValueError(f"tournament round {part!r} must look like group_size:survivors")
            rounds.append(Round(int(m.group(1)), int(m.group(2))))
        return TournamentSpec(rounds=tuple(rounds))

    def tournament(self) -> TournamentSpec:
        return self.parse_rounds(self.tournament_rounds)

    def retriever_options(self) -> RetrieverOptions:
        return RetrieverOptions(
            pooling=self.pooling,
            query_prefix=self.query_prefix,
            doc_prefix=self.doc_prefix,
            max_length=self.max_length,
            batch_size=self.batch_size,
            search_backend=self.search_backend,
            faiss_index=self.faiss_index,
            ray_min_docs=self.ray_min_docs,
            ray_max_actors=self.ray_max_actors,
            ray_num_gpus=self.ray_num_gpus,
        )

    def storage(self) -> StorageConfig:
        return StorageConfig(root=self.out or self.data, s3_endpoint=self.s3_endpoint)


def describe_errors(err: ValidationError) -> str:
    """One line per bad setting, naming it (and, for an unknown one, the known settings)."""
    lines = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            model: type[BaseModel] = EvalSettings
            for part in item["loc"][:-1]:
                model = model.model_fields[str(part)].annotation  # a nested section
            msg = "unknown setting; known: " + ", ".join(sorted(model.model_fields))
        elif item["type"] == "missing":
            msg = "required but not set"
        else:
            msg = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {key}: {msg}")
    return "invalid eval settings:\n" + "\n".join(lines)
