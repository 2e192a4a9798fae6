"""Starting or joining Ray the same way from the CLI, the jobs and the tests."""

from __future__ import annotations

import os

import ray

from cpr_ray.config import RayConfig


def ensure_ray(cfg: RayConfig) -> None:
    """Join the configured cluster, or start a local Ray sized by config; idempotent."""
    if ray.is_initialized():
        return
    if cfg.address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=cfg.address or os.environ["RAY_ADDRESS"], log_to_driver=True)
        return
    kwargs: dict[str, object] = {"include_dashboard": False}
    if cfg.num_cpus:
        kwargs["num_cpus"] = cfg.num_cpus
    if cfg.object_store_memory_mb:
        kwargs["object_store_memory"] = cfg.object_store_memory_mb * 1024**2
    if cfg.temp_dir:
        kwargs["_temp_dir"] = os.path.abspath(cfg.temp_dir)
    # the dry run has no GPU: declare none so no operator can wait forever for one
    ray.init(num_gpus=0, **kwargs)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = True
