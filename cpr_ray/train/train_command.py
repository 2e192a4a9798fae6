"""`cpr train` (registered on the main app in cpr_ray/cpr_command.py); jobs/train.py shares its
config.

Torch, transformers and Ray load only when a run starts, so the CLI stays quick to start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from cpr_ray.config import Config
from cpr_ray.errors import UserError
from cpr_ray.runs.command_options import (
    Flag,
    Given,
    console,
    fail,
    with_flags,
)

# `cpr train`'s and jobs/train.py's own flags (they win over --set, env and YAML)
TRAIN_FLAGS = (
    Flag("train.data"),
    Flag("train.format"),
    Flag("encoder.model", help="Model to fine-tune (path or hub name)"),
    Flag("train.out"),
    Flag("storage.s3_endpoint"),
)
REQUIRED = ("train.data", "train.out", "encoder.model")
PlanOpt = Annotated[
    bool,
    typer.Option(
        "--plan",
        help="Print the memory each GPU needs under DDP and FSDP (from the model's config.json, "
        "no weights loaded; no --data or --out needed) and exit.",
    ),
]


def plan_lines(cfg: Config) -> list[str]:
    """`cpr train --plan`: the model and its parameter count, then the memory per GPU."""
    from cpr_ray.train import memory_plan

    lines = memory_plan.plan_lines(memory_plan.config_plan(cfg))
    if not cfg.train.use_gpu:
        lines.append(
            "note: train.use_gpu is false: this config trains on CPU; the plan is for GPUs"
        )
    return lines


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """What a finished (or already finished) run reports: where the model went and how it did."""
    final = summary.get("final", {})
    data = summary.get("data", {})
    peaks = summary.get("peak_memory_mb_per_worker") or []
    lines = [
        ("already trained: " if summary.get("skipped") else "")
        + f"{summary['steps']} steps on {data.get('examples', '?')} {data.get('format', '')} "
        f"examples, {summary['workers']} {summary.get('strategy', 'ddp')} worker(s)"
        + (f" of {summary['cpus_per_worker']:g} CPU(s)" if summary.get("cpus_per_worker") else "")
        + f", {summary.get('seconds', 0):.0f}s",
    ]
    if summary.get("lora"):
        lora = summary["lora"]
        lines.append(f"LoRA r {lora['r']}, alpha {lora['alpha']:g}: adapters merged into the model")
    if final:
        lines.append(
            f"last step: loss {final['loss']:.4f}, in-batch accuracy {final['accuracy']:.3f}"
        )
    if peaks:
        lines.append("peak memory per worker: " + ", ".join(f"{p:.0f} MiB" for p in peaks))
    lines += [
        f"model → {summary['model']}",
        f"metrics → {summary['metrics']}",
        f"evaluate: cpr eval --benchmark cpr --data EXPORT --retriever dense --model "
        f"{summary['model']}",
    ]
    return lines


@with_flags(TRAIN_FLAGS)
def train_command(given: Given, plan: PlanOpt = False) -> None:
    """Fine-tune a dense retriever with InfoNCE on Ray Train (§4.1)."""
    if plan:
        try:
            lines = plan_lines(given.load())
        except UserError as exc:
            fail(exc)
        for line in lines:
            console.print(line, soft_wrap=True, markup=False, highlight=False)
        return
    from cpr_ray.train.trainer import run_train

    try:
        cfg = given.load(required=REQUIRED)
        summary = run_train(cfg)
    except UserError as exc:
        fail(exc)
    for line in summary_lines(summary):
        console.print(line, soft_wrap=True)
