"""The ordered list of build stages, so the CLI, the jobs and the dry run run the same thing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cpr_ray.config import Config
from cpr_ray.corpus.ingest import ingest
from cpr_ray.mining.stages import mine, venues
from cpr_ray.queries.stages import STAGES as POSITIVE_STAGES
from cpr_ray.ray_runtime import ensure_ray
from cpr_ray.storage import Storage

StageFn = Callable[..., dict[str, Any]]

STAGES: dict[str, StageFn] = {
    "ingest": ingest,
    "venues": venues,
    "mine": mine,
    **POSITIVE_STAGES,
}


def resolve_stages(names: Sequence[str] | None) -> list[str]:
    if not names:
        return list(STAGES)
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    return [n for n in STAGES if n in names]


def run_build(
    cfg: Config, stages: Sequence[str] | None = None, *, force: bool = False
) -> dict[str, dict[str, Any]]:
    """Run the selected stages in pipeline order; returns each stage's manifest."""
    storage = Storage(cfg.storage)
    selected = resolve_stages(stages)
    ensure_ray(cfg.ray)
    return {name: STAGES[name](cfg, storage, force=force) for name in selected}
