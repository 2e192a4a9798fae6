"""The `encoder:` section: one text encoder, as every consumer reads it.

Its fields are declared once, in two parts that the components built from it share by name:
`EncoderSettings` (what the encoder computes and how one process runs it), which
`cpr_ray.retrieval.spec.EncoderSpec` extends, and `EncoderActors` (the Ray actors it runs on),
which `cpr_ray.retrieval.spec.RayEncodeOptions` extends. So a value is checked in one
place, and no component renames a setting the config names.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from cpr_ray.sections import Count, Positive
from cpr_ray.sections import Section as _Section

TokenPooling = Literal["mean", "cls", "last_token"]
Pooling = Literal["auto", TokenPooling]
Dtype = Literal["float32", "float16", "bfloat16"]


class EncoderSettings(_Section):
    """What an encoder computes and how one process runs it: the `encoder:` section's settings
    that every encoder's spec (`EncoderSpec`) holds too."""

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
    batch_size: Count = Field(32, description="Texts per forward pass.")
    dtype: Dtype = Field(
        "float32",
        description="Weights' dtype. bfloat16 pays on a GPU and on a CPU with AVX512-BF16 or "
        "AMX (MiniLM 2.9x float32's documents/s on such a CPU, benchmarks/encode.py); on "
        "other CPUs it is emulated and slower. float16 only on a GPU.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA when the process has a GPU, else CPU."
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


class EncoderActors(_Section):
    """The Ray actors an encoder runs on when a corpus is encoded on an actor pool."""

    actors: Count = Field(2, description="Encoder actors of a Ray Data actor pool, at most.")
    cpus_per_actor: Positive = Field(1.0, description="CPUs each encoder actor reserves.")
    gpus_per_actor: float = Field(0.0, ge=0, description="GPUs each encoder actor reserves.")
    resources_per_actor: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each encoder actor reserves, e.g. {cpr_gpu_node: 1} "
        "so actors land only on the GPU worker type of cluster.yaml.",
    )

    def ray_resources(self) -> dict[str, Any]:
        """What each actor asks Ray for, as an actor's `.options()` and `map_batches` take it
        (custom resources only where there are some)."""
        custom = {"resources": dict(self.resources_per_actor)} if self.resources_per_actor else {}
        return {"num_cpus": self.cpus_per_actor, "num_gpus": self.gpus_per_actor, **custom}


class EncoderConfig(EncoderActors, EncoderSettings):
    """One text encoder, read the same way by evaluation, candidate pooling, training and search."""
