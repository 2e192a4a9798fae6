"""The `encoder:` section: one text encoder, as every consumer reads it."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from cpr_ray.sections import Section as _Section

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
    revision: str | None = Field(
        None,
        description="A hub model's revision to load (a branch, tag or commit hash): pins its "
        "weights and code. Ignored for a model folder.",
    )
