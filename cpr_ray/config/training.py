"""The `train:` section: contrastive fine-tuning and its low-rank adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from cpr_ray.sections import Count, Positive
from cpr_ray.sections import Section as _Section

TrainFormat = Literal["cpr", "triplets", "msmarco", "reasonir", "specter"]
TrainStrategy = Literal["ddp", "fsdp"]


class LoRAConfig(_Section):
    """Low-rank adapters (peft) in place of full fine-tuning: for a user without 8 GPUs. The
    adapters train, checkpoints hold only them, and the final save merges them into the base
    weights, so the output is a plain sentence-transformers model."""

    r: Count = Field(16, description="Adapter rank.")
    alpha: Positive = Field(32.0, description="Adapter scale numerator (scale = alpha / r).")
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
    samples: Count | None = Field(
        None, description="Pairs sampled (with seed) after filtering; unset: all."
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
    batch_size: Count = Field(
        128, description="Queries per optimiser step, over all workers (the global batch)."
    )
    chunk_size: Count | None = Field(
        64,
        description="Texts per forward pass. A worker whose batch has more texts (queries, "
        "positives, negatives) uses a gradient cache: embeddings first, then the gradients "
        "replayed chunk by chunk, so every query still sees the whole global batch as "
        "negatives. Unset: one forward per step.",
    )
    epochs: Count = Field(1, description="Passes over the data.")
    max_steps: Count | None = Field(
        None,
        description="Stop after this many optimiser steps (the schedule still spans the "
        "epochs); unset: all.",
    )
    lr: Positive = Field(6e-6, description="Peak learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps before the cosine.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="The cosine decays to lr times this at the last step."
    )
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    eps: Positive = Field(1e-8, description="AdamW epsilon.")
    weight_decay: float = Field(
        0.1, ge=0, description="AdamW weight decay (not on biases and norm weights)."
    )
    max_grad_norm: Positive | None = Field(
        1.0, description="Clip the global gradient norm to this; unset: no clipping."
    )
    temperature: Positive = Field(
        0.05, description="InfoNCE temperature (0.05: sentence-transformers' scale 20)."
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
    gpu_memory_gb: Positive = Field(
        80.0,
        description="Memory of one worker's GPU, for the memory plan (cpr train "
        "--plan) and the check before a run starts.",
    )
    workers: Count = Field(1, description="Ray Train workers (one process, one GPU each).")
    use_gpu: bool = Field(False, description="One GPU per worker.")
    cpus_per_worker: Positive | None = Field(
        None,
        description="CPUs each worker reserves (also its torch threads, at least 1). Unset: on "
        "a local Ray the workers share its CPUs (a 1-worker run uses every core); on GPU "
        "workers or a cluster, 1.",
    )
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each worker reserves, e.g. {cpr_gpu_node: 1}.",
    )
    checkpoint_every: Count = Field(
        20, description="Steps between checkpoints (and at the last step)."
    )
    keep_checkpoints: Count = Field(2, description="Checkpoints kept in storage.")
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
