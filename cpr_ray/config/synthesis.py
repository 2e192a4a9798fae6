"""The `synthesis:` section: the synthesize-queries stage and its Q-D metrics."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cpr_ray.sections import Positive
from cpr_ray.sections import Section as _Section


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
    paraphrase_threshold: Positive = Field(
        0.5, lt=1, description="CE score at which a pair counts as paraphrases."
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where the metric models run.")
