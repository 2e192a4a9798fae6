"""A `cpr eval` results dict in MTEB's result format, so MTEB's results tooling reads our runs.

MTEB keeps results in a cache folder laid out as ``results/<model>/<revision>/<Task>.json``
(a ``TaskResult``: ``task_name``, ``dataset_revision``, ``mteb_version``, ``evaluation_time``,
``scores`` per split, one entry per HF subset with ``main_score``, ``hf_subset`` and
``languages``) with a ``model_meta.json`` beside it. The publisher (`publish.py`) writes one
such file for a CPR run (``cpr`` -> task ``CPREval``, ``cpr-full`` -> ``CPREvalFull``, the names of
`cpr_ray.evaluate.mteb_task`) under ``<folder of the results JSON>/_mteb``, so that
``mteb.ResultCache("<that folder>/_mteb").load_results()`` reads it. The leading ``_`` keeps
`cpr report`, which reads every other ``*.json`` of a results folder, off MTEB's files.

Only what the run computed is written: Recall@1/5/10/100, MRR@10, nDCG@10 and MTEB's
``accuracy`` (its Recall@1); the confidence intervals and per-domain blocks stay in our JSON.
Other benchmarks (BEIR, BRIGHT, AnaloBench) get no MTEB file: MTEB's own tasks for them load
other data. Building the file needs no mteb install (the tests load it with mteb's loader).

Names: a hub model keeps its name (``intfloat/e5-base-v2``); a local model or BM25 becomes
``cpr-ray/<label>``; a reranker or rewriter is part of what was run, so it extends the name
(``…+rerank-llm-tournament``), as hybrid retrieval's fusion does (``…+hybrid-rrf-k60-d100``).
The revision is MTEB's ``no_revision_available``. A data variant
or another split table extends the task name (``CPREval-no-e5``), so runs never overwrite each
other's file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import posixpath
import re
from typing import Any

from cpr_ray.config.search import retriever_label
from cpr_ray.evaluate.ir_metrics import METRICS
from cpr_ray.retrieval.model_source import model_label
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables.table_files import find_table

# benchmark -> MTEB task name (`mteb_task.CPREval` / `CPREvalFull` carry the same names)
TASK_NAMES = {"cpr": "CPREval", "cpr-full": "CPREvalFull"}
# the export format (DESIGN.md, "Dataset export format") both tasks and this writer declare
DATASET_REVISION = "cpr-export-1"
MAIN_SCORE = "recall_at_10"  # the primary metric of CPR-eval (`Benchmark.primary_metric`)
SPLIT, SUBSET, LANGUAGES = "test", "default", ["eng-Latn"]
DEFAULT_TABLE = "cpr-eval"
NO_REVISION = "no_revision_available"  # MTEB's revision of a model without one
FOLDER = "_mteb"  # under the results folder; `_`: skipped by `cpr report`
# the mteb release whose TaskResult / model_meta.json format this writer follows
MTEB_FORMAT_VERSION = "2.26.24"
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def export_revision(storage: Storage, root: str, table: str = DEFAULT_TABLE) -> str:
    """The dataset revision of an export's MTEB task: the format, then a fingerprint of the
    files of its split table and corpus (path, size, modification time; nothing is read), so a
    result made on one export of a name never passes for another's."""
    digest = hashlib.blake2b(digest_size=8)
    for name in (table, "corpus"):
        uri = find_table(storage, root, name)
        if uri is None:
            continue  # the loader names what is missing
        loc = storage.resolve(uri)
        infos = (
            [loc.fs.get_file_info(loc.path)] if storage.is_file(uri) else storage.list_files(uri)
        )
        for info in infos:
            rel = posixpath.relpath(info.path, loc.path)
            digest.update(f"{name}/{rel}:{info.size}:{info.mtime_ns}\n".encode())
    return f"{DATASET_REVISION}+{digest.hexdigest()}"


def mteb_task_name(results: dict[str, Any]) -> str | None:
    """The MTEB task a run's results belong to, or None for a benchmark MTEB has no task of ours."""
    name = TASK_NAMES.get(results.get("benchmark", ""))
    if name is None:
        return None
    extra = [
        results.get("subset") if results.get("subset") not in (None, DEFAULT_TABLE) else None,
        results.get("variant") if results.get("variant") not in (None, "full") else None,
    ]
    suffix = "-".join(str(e) for e in extra if e)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{name}-{suffix}") if suffix else name


def mteb_model_name(results: dict[str, Any]) -> str:
    """MTEB's model name for what produced the run (see the module docstring)."""
    model = results.get("model")
    if model and HUB_NAME.match(str(model)) and not os.path.isdir(str(model)):
        name = str(model)
    else:
        name = f"cpr-ray/{model_label(model) or results['retriever']}"
    if results.get("fusion"):
        name += f"+{retriever_label(results)}"
    for key in ("rewrite", "rerank"):
        if results.get(key):
            name += f"+{key}-{results[key]}"
    return name


def task_result(results: dict[str, Any]) -> dict[str, Any]:
    """The ``TaskResult`` JSON of a CPR run (scores rounded to 6 places, as MTEB writes them)."""
    task = mteb_task_name(results)
    if task is None:
        raise ValueError(f"benchmark {results.get('benchmark')!r} has no MTEB task of cpr-ray")
    scores: dict[str, Any] = {m: round(float(results[m]["value"]), 6) for m in METRICS}
    scores["accuracy"] = scores["recall_at_1"]  # MTEB's name for Recall@1 of a retrieval task
    scores["main_score"] = scores[MAIN_SCORE]
    created = results.get("created")
    return {
        "dataset_revision": results.get("dataset_revision") or DATASET_REVISION,
        "task_name": task,
        "mteb_version": MTEB_FORMAT_VERSION,
        "scores": {
            SPLIT: [
                {
                    **scores,
                    "hf_subset": SUBSET,
                    "languages": LANGUAGES,
                    "mteb_version": MTEB_FORMAT_VERSION,
                }
            ]
        },
        "evaluation_time": results.get("timing", {}).get("total_s"),
        "kg_co2_emissions": None,
        "date": dt.datetime.fromisoformat(created).timestamp() if created else None,
        "evaluation_phases": None,
    }


def model_meta(results: dict[str, Any]) -> dict[str, Any]:
    """``model_meta.json``: the name and revision MTEB's loader keys results by, the rest null."""
    unknown = (
        "release_date languages n_parameters n_active_parameters_override "
        "n_embedding_parameters memory_usage_mb max_tokens embed_dim license open_weights "
        "public_training_code public_training_data reference similarity_fn_name use_instructions "
        "training_datasets adapted_from superseded_by citation contacts experiment_kwargs "
        "output_dtypes extra_requirements_groups loader"
    ).split()
    sparse = results.get("retriever") in ("bm25", "splade")
    kind = ["dense", "sparse"] if results.get("retriever") == "hybrid" else None
    return {
        "name": mteb_model_name(results),
        "revision": NO_REVISION,
        **dict.fromkeys(unknown),
        "loader_kwargs": {},
        "framework": [],
        "modalities": ["text"],
        "model_type": kind or ["sparse" if sparse else "dense"],
    }


def mteb_result_uri(results_uri: str, results: dict[str, Any]) -> str | None:
    """Where `write_mteb_results` puts the task file for results JSON written at `results_uri`."""
    task = mteb_task_name(results)
    if task is None:
        return None
    folder = posixpath.dirname(results_uri) or "."
    model = mteb_model_name(results).replace("/", "__").replace(" ", "_")
    return join(folder, FOLDER, "results", model, NO_REVISION, f"{task}.json")


def write_mteb_results(storage: Storage, results_uri: str, results: dict[str, Any]) -> str | None:
    """Write the MTEB task file and its ``model_meta.json`` beside the results JSON at
    `results_uri`; returns the task file's URI, or None (writing nothing) for a benchmark
    without an MTEB task of ours."""
    uri = mteb_result_uri(results_uri, results)
    if uri is None:
        return None
    storage.write_json(uri, task_result(results))
    # shared by every run of this model; each writes it whole with the same name and revision
    storage.write_json(join(posixpath.dirname(uri), "model_meta.json"), model_meta(results))
    return uri
