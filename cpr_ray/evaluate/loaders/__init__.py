"""Benchmark loaders: each turns its files into :class:`cpr_ray.evaluate.benchmark.Benchmark`."""

from __future__ import annotations

from cpr_ray.errors import ConfigError
from cpr_ray.evaluate.benchmark import Benchmark
from cpr_ray.storage.store import Storage

BENCHMARKS = ("cpr", "cpr-full", "beir", "analobench", "bright")


def load_benchmark(
    kind: str, storage: Storage, uri: str, *, subset: str | None = None, seed: int = 0
) -> list[Benchmark]:
    """One benchmark as a list of parts, each evaluated on its own (BRIGHT: one per subset).

    `subset`: CPR-eval (``cpr``: per-query pools; ``cpr-full``: the whole corpus) — the split
    table (default ``cpr-eval``); BEIR — the qrels split (default
    ``test``); AnaloBench — t2 (default), t2-stories-10, t2-stories-30, t1, …; BRIGHT — comma-
    separated subsets (default: the seven StackExchange ones).
    """
    if kind == "cpr":
        from cpr_ray.evaluate.loaders.cpr_eval import load_cpr

        return [load_cpr(storage, uri, split=subset or "cpr-eval")]
    if kind == "cpr-full":
        from cpr_ray.evaluate.loaders.cpr_eval import load_cpr

        return [load_cpr(storage, uri, split=subset or "cpr-eval", full=True)]
    if kind == "beir":
        from cpr_ray.evaluate.loaders.beir import load_beir

        return [load_beir(storage, uri, split=subset or "test")]
    if kind == "analobench":
        from cpr_ray.evaluate.loaders.analobench import load_analobench

        return [load_analobench(storage, uri, subset=subset or "t2", seed=seed)]
    if kind == "bright":
        from cpr_ray.evaluate.loaders.bright import STACKEXCHANGE, load_bright

        names = [s.strip() for s in subset.split(",")] if subset else list(STACKEXCHANGE)
        return [load_bright(storage, uri, subset=name) for name in names]
    raise ConfigError(f"unknown benchmark {kind!r}; known: {', '.join(BENCHMARKS)}")
