"""The root of the settings tree: every section under its key, and the stage fingerprint."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field, field_validator, model_validator

from cpr_ray.config.bundled import profile_names
from cpr_ray.config.cluster import RayConfig
from cpr_ray.config.dataset import DatasetConfig
from cpr_ray.config.encoder import EncoderConfig
from cpr_ray.config.evaluation import EvalConfig
from cpr_ray.config.ingest import IngestConfig
from cpr_ray.config.inputs import InputConfig
from cpr_ray.config.llm import LLMConfig
from cpr_ray.config.mining import MiningConfig
from cpr_ray.config.pooling import PoolingConfig
from cpr_ray.config.refresh import RefreshConfig
from cpr_ray.config.search import FusionConfig, SearchConfig
from cpr_ray.config.synthesis import SynthesisConfig
from cpr_ray.config.tracking import TrackingConfig
from cpr_ray.config.training import TrainConfig
from cpr_ray.errors import ConfigError
from cpr_ray.sections import Section as _Section
from cpr_ray.storage.settings import StorageConfig


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
    fusion: FusionConfig = FusionConfig()
    tracking: TrackingConfig = TrackingConfig()

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
