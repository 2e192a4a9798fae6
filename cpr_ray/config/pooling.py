"""The `pooling:` section: the N1 candidate poolers and their depths (§3.3)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cpr_ray.config.encoder import EncoderConfig
from cpr_ray.sections import Count
from cpr_ray.sections import Section as _Section

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
    top_k: Count = Field(
        300,
        description="Depth of each pooler's ranked list per candidate group and query; a group "
        "keeps at most this many candidates.",
    )
    top_k_short: Count = Field(
        1000, description="Depth for queries whose groups stay short at top_k."
    )
    min_group_size: Count = Field(
        50,
        description="A group with fewer candidates than this at top_k is short, and its query is "
        "pooled again at top_k_short (judge-negatives takes dataset.eval_negatives_per_group "
        "negatives per group of an eval query, so keep this at least that).",
    )
    ivf_min_docs: Count = Field(
        1_000_000,
        description="Dense poolers search an exact flat faiss index below this many documents "
        "and an inverted-file (IVF) index from it.",
    )
    ivf_lists: Count | None = Field(None, description="IVF lists; unset: 4·√documents.")
    ivf_nprobe: Count = Field(64, description="IVF lists searched per query.")
    shard_vectors: Count = Field(
        1_500_000,
        description="Papers per shard of the universe, about (a hash of the corpus id spreads "
        "them): each dense or SPLADE pooler's index is built and searched one shard at a time, "
        "and the shards' lists merged into exactly those one index gives. A search actor asks "
        "Ray for one shard's memory (768-dim float32: ~9.3 kB a paper while it loads, plus "
        "2 GiB), so size this to the GPU nodes' memory (benchmarks/SCALE.md). BM25 searches "
        "every paper in one actor.",
    )
    search_batch: Count = Field(
        256, description="Queries per search call of a pooler's search actor."
    )
    search_actors: Count = Field(
        1,
        description="Search actors per pooler, at most; each holds the pooler's CPUs and GPUs "
        "and one shard of its index at a time (a SPLADE pooler's also its query encoder; a dense "
        "pooler's query vectors come from the store).",
    )
    encode_batch_rows: Count = Field(
        1024,
        description="Documents per map_batches call of an encoder actor; this many texts to "
        "encode or fewer (a refresh's new papers) are encoded in one Ray task, not an actor pool.",
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
