"""The `search:` section: the index, `cpr search` and the service's limits."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from cpr_ray.sections import Count, Positive
from cpr_ray.sections import Section as _Section


class ServeConfig(_Section):
    """The search service (`cpr serve`): limits that keep an overloaded service answering."""

    host: str = Field("127.0.0.1", description="Address the HTTP proxy listens on.")
    port: Count = Field(8000, le=65535, description="Port of the HTTP proxy.")
    max_ongoing_requests: Count = Field(
        8, description="Requests a replica runs at once (Ray Serve max_ongoing_requests)."
    )
    max_queued_requests: Count = Field(
        16,
        description="Requests waiting for a replica; past it the service answers 503 at once "
        "instead of queueing without bound.",
    )
    min_replicas: Count = Field(1, description="Replicas kept up (autoscaling floor).")
    max_replicas: Count = Field(1, description="Replicas at most (autoscaling ceiling).")
    target_ongoing_requests: Positive = Field(
        4.0, description="Ongoing requests per replica the autoscaler aims at."
    )
    cpus_per_replica: Positive = Field(1.0, description="CPUs each replica reserves.")
    max_body_bytes: int = Field(
        65_536, ge=256, description="Largest request body; bigger ones get 413."
    )
    max_queries: Count = Field(32, description="Queries per request at most.")
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


class FusionConfig(_Section):
    """How hybrid retrieval fuses its dense and BM25 rankings: one section for `cpr search`,
    `cpr serve` and `cpr eval --retriever hybrid`, so what is measured is what is searched.
    Chosen by `benchmarks/fusion.py` (docs/search.md, "Choosing the fusion")."""

    method: Literal["rrf", "convex"] = Field(
        "rrf",
        description="rrf: reciprocal rank fusion, sum of 1/(k + rank); convex: weight x dense + "
        "(1 - weight) x BM25, each side's scores min-max normalised over its own hits.",
    )
    k: int = Field(60, ge=0, description="rrf's constant (Cormack et al.'s 60).")
    weight: float = Field(
        0.5, ge=0, le=1, description="convex: the dense side's weight (BM25's is 1 - weight)."
    )
    depth: Count = Field(100, description="Hits of each side fused (at least the hits asked for).")


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
    shard_size: Count = Field(
        1_000_000, description="Vectors per faiss shard; a bigger corpus gets several."
    )
    ivf_min_vectors: Count = Field(
        2_000_000,
        description="Shards this big get an IVF index (nprobe lists searched); smaller are Flat "
        "(exact).",
    )
    nprobe: Count = Field(32, description="Inverted lists an IVF shard searches per query.")
    bm25: bool = Field(
        True,
        description="Build a BM25 index beside the dense one; `cpr search` and `cpr serve` "
        "then fuse both (`fusion:`). --no-bm25: dense only.",
    )
    k: Count = Field(10, description="Hits per query.")
    max_k: Count = Field(1000, description="Largest k a query may ask for.")
    infer_field_k: Count = Field(
        20, description="Nearest papers whose majority field is the query's own field."
    )
    rerank_depth: int = Field(30, ge=2, description="Candidates the --rerank llm tournament ranks.")
    query_batch: Count = Field(256, description="Queries encoded and searched together.")
    serve: ServeConfig = ServeConfig()


def retriever_label(results: dict[str, Any]) -> str:
    """The retriever as a run names it: ``hybrid`` with its fusion (``hybrid-rrf-k60-d100``,
    ``hybrid-convex-w0.3-d100``), so runs of two fusions never share a name, a file or a row."""
    fusion = results.get("fusion")
    if not fusion:
        return str(results["retriever"])
    knob = f"k{fusion['k']}" if fusion["method"] == "rrf" else f"w{fusion['weight']:g}"
    return f"{results['retriever']}-{fusion['method']}-{knob}-d{fusion['depth']}"
