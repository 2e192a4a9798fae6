"""One validated settings tree for every stage, job and CLI command.

Values come, lowest precedence first, from a named profile shipped with the package, a YAML file,
``CPR_*`` environment variables (``CPR_INGEST__NUM_BUCKETS=16``) and ``--set key.path=value``
flags. Everything is validated before any work starts, so a typo in a cluster config fails in a
second on the laptop instead of an hour into a job, with the key and the allowed values named.
"""

from __future__ import annotations

from cpr_ray.config.bundled import MINILM_PACKAGE, minilm_dir, profile_names, sample_dir
from cpr_ray.config.cluster import RayConfig
from cpr_ray.config.dataset import DatasetConfig, license_code
from cpr_ray.config.encoder import EncoderActors, EncoderConfig, EncoderSettings, Pooling
from cpr_ray.config.evaluation import Benchmark, EvalConfig, RetrieverName, RewriteKind
from cpr_ray.config.ingest import IngestConfig
from cpr_ray.config.inputs import InputConfig
from cpr_ray.config.llm import (
    BUILD_LLM_STAGES,
    LLM_STAGES,
    BuildLLMStage,
    LLMConfig,
    LLMStage,
    LLMStageConfig,
    Price,
    stage_name,
)
from cpr_ray.config.loading import ENV_NESTING, ENV_PREFIX, format_validation_error, load_config
from cpr_ray.config.mining import MiningConfig
from cpr_ray.config.pooling import TEMPLATE_FIELDS, PoolerConfig, PoolingConfig
from cpr_ray.config.refresh import RefreshConfig
from cpr_ray.config.search import FusionConfig, SearchConfig, ServeConfig
from cpr_ray.config.synthesis import SynthesisConfig
from cpr_ray.config.tracking import TrackingConfig
from cpr_ray.config.training import (
    QUESTION_WORDS,
    LoRAConfig,
    TrainConfig,
    TrainFormat,
    TrainStrategy,
)
from cpr_ray.config.tree import Config

# the error load_config raises and the storage section the tree holds, named where the tree is
from cpr_ray.errors import ConfigError
from cpr_ray.storage.settings import StorageConfig

__all__ = [
    "BUILD_LLM_STAGES",
    "ENV_NESTING",
    "ENV_PREFIX",
    "LLM_STAGES",
    "MINILM_PACKAGE",
    "QUESTION_WORDS",
    "TEMPLATE_FIELDS",
    "Benchmark",
    "BuildLLMStage",
    "Config",
    "ConfigError",
    "DatasetConfig",
    "EncoderActors",
    "EncoderConfig",
    "EncoderSettings",
    "EvalConfig",
    "FusionConfig",
    "IngestConfig",
    "InputConfig",
    "LLMConfig",
    "LLMStage",
    "LLMStageConfig",
    "LoRAConfig",
    "MiningConfig",
    "PoolerConfig",
    "Pooling",
    "PoolingConfig",
    "Price",
    "RayConfig",
    "RefreshConfig",
    "RetrieverName",
    "RewriteKind",
    "SearchConfig",
    "ServeConfig",
    "StorageConfig",
    "SynthesisConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainFormat",
    "TrainStrategy",
    "format_validation_error",
    "license_code",
    "load_config",
    "minilm_dir",
    "profile_names",
    "sample_dir",
    "stage_name",
]
