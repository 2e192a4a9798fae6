"""The results file of one run: what it holds, its name, writing and reading it.

Top-level keys: ``recall_at_1``, ``recall_at_5``, ``recall_at_10``, ``mrr_at_10``,
``ndcg_at_10`` (each ``{value, ci_low, ci_high, random, vs_random}``), ``accuracy`` (AnaloBench
T1), ``per_domain`` (same blocks per OpenAlex domain, with ``n_queries``), ``per_subset`` and
``macro_over_subsets`` (BRIGHT), ``robustness``, ``n_queries``, the run's identity (``benchmark``,
``subset``, ``variant``, ``data``, ``retriever``, ``model``, ``rerank``, ``rewrite``, and for
``hybrid`` the ``fusion`` that fused its sides: method, its constant or weight, depth),
``settings``, ``timing`` (seconds per stage), ``input_rejects`` and ``rerank_stats``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from cpr_ray.config import Config
from cpr_ray.config.search import retriever_label
from cpr_ray.errors import InputError
from cpr_ray.evaluate.benchmark import Benchmark
from cpr_ray.evaluate.ir_metrics import METRICS
from cpr_ray.retrieval.model_source import model_label
from cpr_ray.storage.store import Storage, join

SCHEMA_VERSION = 1
BLOCK_KEYS = ("value", "ci_low", "ci_high", "random", "vs_random")
# (section, key) recorded under "settings" by key, as results files have always named them
RECORDED_SETTINGS = (
    ("eval", "seed"),
    ("eval", "resamples"),
    ("eval", "confidence"),
    ("eval", "gain"),
    ("eval", "top_k"),
    ("encoder", "pooling"),
    ("encoder", "query_prefix"),
    ("encoder", "doc_prefix"),
    ("encoder", "max_length"),
    ("eval", "search_backend"),
    ("eval", "faiss_index"),
    ("eval", "rerank_depth"),
    ("eval", "tournament_rounds"),
    ("eval", "fusion_k"),
    ("eval", "fusion_include_original"),
    ("eval", "hyde_passages"),
)


def build_results(
    cfg: Config,
    parts: Sequence[Benchmark],
    summary: dict[str, Any],
    *,
    names: dict[str, Any],
    timing: dict[str, float],
    robustness: dict[str, Any],
    rerank_stats: dict[str, int],
) -> dict[str, Any]:
    from cpr_ray.evaluate.mteb_results import DEFAULT_TABLE, TASK_NAMES, export_revision
    from cpr_ray.runs.stage_runner import code_version

    ev = cfg.eval
    rejects = [{"part": p.name, **r} for p in parts for r in p.rejects]
    revision = (  # the export's, as its MTEB task records it
        {
            "dataset_revision": export_revision(
                Storage(cfg.storage), ev.data, ev.subset or DEFAULT_TABLE
            )
        }
        if ev.benchmark in TASK_NAMES and ev.data
        else {}
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": ev.benchmark,
        "subset": ev.subset or _default_subset(parts),
        "variant": ev.variant,
        "data": ev.data,
        **revision,
        "retriever": names.get("retriever", ev.retriever),
        "model": names.get("model", cfg.encoder.model),
        "rerank": names.get("rerank"),
        "rewrite": names.get("rewrite"),
        "fusion": names.get("fusion"),
        "primary_metric": parts[0].primary_metric if parts else "recall_at_10",
        **summary,
        "robustness": robustness,
        "rerank_stats": rerank_stats,
        "input_rejects": rejects,
        "settings": {k: getattr(getattr(cfg, s), k) for s, k in RECORDED_SETTINGS},
        "timing": timing,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "code_version": code_version(),
    }


def _default_subset(parts: Sequence[Benchmark]) -> str | None:
    names = [p.name.split(":", 1)[1] for p in parts if ":" in p.name]
    return ",".join(names) if names else None


def results_name(results: dict[str, Any]) -> str:
    """A file name that tells runs apart: benchmark, subset, retriever, model, options, variant."""
    bits = [
        results["benchmark"],
        results.get("subset") if results.get("subset") and "," not in results["subset"] else None,
        retriever_label(results),
        model_label(results.get("model")),
        f"rerank-{results['rerank']}" if results.get("rerank") else None,
        f"rewrite-{results['rewrite']}" if results.get("rewrite") else None,
        results.get("variant") if results.get("variant") not in (None, "full") else None,
    ]
    stem = "-".join(str(b) for b in bits if b)
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", stem) + ".json"


def write_results(storage: Storage, out: str, results: dict[str, Any]) -> str:
    """Write to `out` when it names a .json file, else into the folder `out`; returns the URI.
    (`publish.publish` writes a run's other files beside it.)"""
    uri = out if out.endswith(".json") else join(out, results_name(results))
    storage.write_json(uri, results)
    return uri


def check_results(results: dict[str, Any], where: str = "results") -> None:
    """Fail naming the first missing key, so `cpr report` explains a foreign or broken file."""
    for key in ("benchmark", "retriever", "n_queries", "per_domain", *METRICS):
        if key not in results:
            raise InputError(f"{where}: not a cpr eval results file (no {key!r})")
    for m in METRICS:
        missing = [k for k in BLOCK_KEYS if k not in results[m]]
        if missing:
            raise InputError(f"{where}: {m} lacks {', '.join(missing)}")
