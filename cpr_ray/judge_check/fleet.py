"""The GPU fleet that serves the judges: does a model fit a replica, and how long a build keeps
each model busy.

Two questions come before an operator provisions `infra/judges/` (or buys a provider's tokens):

- **Memory.** A vLLM replica of a model on `tp` tensor-parallel GPUs holds, on each GPU, its
  share of the bf16 weights (2 bytes a parameter), vLLM's working memory (activations of one
  scheduled batch, CUDA graphs, NCCL buffers) and the KV cache of the sequences in flight. vLLM
  claims `gpu_memory_utilization` of each GPU for all three and refuses to start when the KV
  cache left over cannot hold one `max_model_len` sequence. `replica_fit` does that arithmetic.
- **Time.** The tokens a build sends each model (the projection's rows per stage × tokens per
  row) over a throughput per GPU give GPU-hours, and over the GPUs the fleet gives the model,
  wall hours. The throughput is one published measurement, scaled: decoding a dense model is
  bound by reading its weights from GPU memory, so tokens/s per GPU go as memory bandwidth ÷
  parameters. `cpr judge-check` measures the real endpoint's seconds per answer once it runs.
- **Money.** The nodes a stage holds (its model at most replicas, every other model at its
  fewest) for its wall hours are node-hours (`node_hours`), at the profile's
  `llm.fleet.node_hour_usd` dollars. The spend ledger charges a stage more than that, the
  fleet's most nodes (`llm.fleet.nodes`) for every hour it asks (`llm.spend.FleetMeter`), an
  upper bound the cap holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from cpr_ray.config import DatasetConfig
from cpr_ray.judge_check.projection import Volumes, per_row, volumes
from cpr_ray.stages import (
    JUDGE_ANALOGY,
    JUDGE_NEGATIVES,
    JUDGE_TRANSFER,
    SCORE_POSITIVES,
    WRITE_QUERIES,
)

GIB = 1024**3
BF16_BYTES = 2


@dataclass(frozen=True)
class ModelShape:
    """What memory and speed depend on: parameters and the attention's KV layout."""

    params_b: float  # parameters, billions
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def weights_gib(self) -> float:
        return self.params_b * 1e9 * BF16_BYTES / GIB

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, bf16. Gemma 3's sliding-window layers are counted as full
        ones, an upper bound for vLLM's hybrid KV allocator."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16_BYTES


@dataclass(frozen=True)
class GPU:
    name: str  # Ray's accelerator type, as LLMConfig.accelerator_type names it
    memory_gib: float  # what CUDA reports (nvidia-smi's total)
    bandwidth_gb_s: float  # memory bandwidth, NVIDIA's datasheet


# the models' config.json (num_hidden_layers, num_key_value_heads, head_dim) and model cards
# (parameter counts, vision tower included for Gemma 3)
MODELS: dict[str, ModelShape] = {
    "Qwen/Qwen3-32B": ModelShape(params_b=32.8, layers=64, kv_heads=8, head_dim=128),
    "meta-llama/Llama-3.3-70B-Instruct": ModelShape(
        params_b=70.6, layers=80, kv_heads=8, head_dim=128
    ),
    "google/gemma-3-27b-it": ModelShape(params_b=27.4, layers=62, kv_heads=16, head_dim=128),
}

GPUS: dict[str, GPU] = {
    "L40S": GPU("L40S", memory_gib=46068 / 1024, bandwidth_gb_s=864),  # g6e
    "A100-80G": GPU("A100-80G", memory_gib=80.0, bandwidth_gb_s=2039),  # p4de
    "H100": GPU("H100", memory_gib=81559 / 1024, bandwidth_gb_s=3350),  # p5
}

# the GPUs of the EC2 instance types a fleet is sized for: (GPU, GPUs per instance)
INSTANCES: dict[str, tuple[str, int]] = {
    "g6e.12xlarge": ("L40S", 4),
    "g6e.48xlarge": ("L40S", 8),
    "p4de.24xlarge": ("A100-80G", 8),
    "p5.48xlarge": ("H100", 8),
}

# vLLM's working memory per GPU beside weights and KV cache (activations of a chunked-prefill
# batch of 8k tokens, CUDA graphs, NCCL buffers): an allowance, not a measurement
OVERHEAD_GIB = 2.5


class Reference(TypedDict):
    """A measured throughput the fleet's sizing scales from."""

    tokens_per_s: float
    params_b: float
    gpu: str
    source: str


# Throughput reference: Qwen3-32B bf16 on one A100 SXM 80GB, vLLM without tuning, ShareGPT
# prompts at high concurrency: 1,731 total (prompt + completion) tokens/s. GPUStack performance
# lab, "Optimizing Qwen3-32B Throughput on NVIDIA A100 GPUs", baseline column.
REFERENCE: Reference = {
    "tokens_per_s": 1731.0,
    "params_b": 32.8,
    "gpu": "A100-80G",
    "source": "https://docs.gpustack.ai/2.0/performance-lab/qwen3-32b/a100",
}

# the stages the fleet's table sizes (dedup, the strongest choice and synthesis add minutes)
FLEET_STAGES = (
    JUDGE_ANALOGY,
    JUDGE_TRANSFER,
    WRITE_QUERIES,
    SCORE_POSITIVES,
    JUDGE_NEGATIVES,
)


@dataclass(frozen=True)
class ReplicaFit:
    """One replica's memory per GPU, and the KV cache it leaves."""

    weights_gib_per_gpu: float
    usable_gib_per_gpu: float
    kv_gib: float  # over all the replica's GPUs
    kv_tokens: int
    max_model_len: int

    @property
    def fits(self) -> bool:
        """vLLM starts only if the KV cache holds one sequence of max_model_len."""
        return self.kv_tokens >= self.max_model_len

    def sequences(self, tokens_per_request: int) -> int:
        """Requests of that length the KV cache holds at once (more wait in vLLM's queue)."""
        return self.kv_tokens // max(1, tokens_per_request)


def replica_fit(
    shape: ModelShape,
    gpu: GPU,
    tensor_parallel: int,
    *,
    max_model_len: int,
    gpu_memory_utilization: float = 0.9,
    overhead_gib: float = OVERHEAD_GIB,
) -> ReplicaFit:
    """Weights + working memory + KV cache of one replica against its GPUs' memory."""
    usable = gpu.memory_gib * gpu_memory_utilization
    weights = shape.weights_gib / tensor_parallel
    kv_gib = max(0.0, usable - weights - overhead_gib) * tensor_parallel
    return ReplicaFit(
        weights_gib_per_gpu=round(weights, 2),
        usable_gib_per_gpu=round(usable, 2),
        kv_gib=round(kv_gib, 2),
        kv_tokens=int(kv_gib * GIB // shape.kv_bytes_per_token),
        max_model_len=max_model_len,
    )


def tokens_per_gpu_second(shape: ModelShape, gpu: GPU) -> float:
    """The reference throughput scaled by memory bandwidth and by parameters."""
    ref_gpu = GPUS[REFERENCE["gpu"]]
    scale = (gpu.bandwidth_gb_s / ref_gpu.bandwidth_gb_s) * (REFERENCE["params_b"] / shape.params_b)
    return REFERENCE["tokens_per_s"] * scale


@dataclass(frozen=True)
class StageLoad:
    stage: str
    model: str
    tokens: int  # prompt + completion, the whole build
    gpu_hours: float  # busy GPU-hours at the scaled throughput
    wall_hours: float  # on the GPUs the fleet gives the model at its most replicas


def build_load(
    stage_models: Mapping[str, str],
    gpu: GPU,
    gpus_per_model: Mapping[str, int],
    vol: Volumes | None = None,
) -> list[StageLoad]:
    """Each judged stage's tokens, busy GPU-hours and wall hours on the fleet.

    `stage_models` maps a stage to the model it asks (`LLMConfig.for_stage`); `gpus_per_model`
    is the GPUs a model's replicas hold at `max_replicas` (replicas × tensor parallel); `vol`
    the rows per stage, by default the projection's at full scale (negatives as judged, query
    writing with its regenerations), at the dry run's ledger tokens per row."""
    vol = vol or volumes(DatasetConfig())
    loads = []
    for stage in FLEET_STAGES:
        model = stage_models[stage]
        means, _ = per_row(stage, {}, vol.rates)
        tokens = round(vol.rows[stage] * (means.prompt_tokens + means.completion_tokens))
        gpu_hours = tokens / tokens_per_gpu_second(MODELS[model], gpu) / 3600
        loads.append(
            StageLoad(
                stage=stage,
                model=model,
                tokens=tokens,
                gpu_hours=round(gpu_hours, 1),
                wall_hours=round(gpu_hours / gpus_per_model[model], 2),
            )
        )
    return loads


# what a re-ask carries back: the rejected answer, cut at 4,000 characters (llm/client.py), about
# 1,000 tokens, and the objection
REASK_TOKENS = 1060


def longest_conversation(prompt_tokens: int, max_tokens: int, max_reasks: int) -> int:
    """Tokens of a stage's longest request, which `max_model_len` must hold: a prompt twice the
    mean (abstracts vary in length), every re-ask's carried answer and objection, and the
    answer's limit."""
    return 2 * prompt_tokens + max_reasks * REASK_TOKENS + max_tokens


def nodes_held(replica_nodes: Mapping[str, tuple[int, int]], busy: str) -> int:
    """Nodes the fleet holds while `busy` works: its nodes at most replicas, every other model's
    at its fewest. `replica_nodes`: model -> (nodes at min_replicas, nodes at max_replicas)."""
    return replica_nodes[busy][1] + sum(
        low for model, (low, _) in replica_nodes.items() if model != busy
    )


def node_hours(load: StageLoad, replica_nodes: Mapping[str, tuple[int, int]]) -> float:
    """Node-hours of the fleet while a stage judges (the stage's wall hours × nodes held)."""
    return round(load.wall_hours * nodes_held(replica_nodes, load.model), 1)
