"""The model card `cpr train` writes into ``OUT/model``: the facts of the finished run, gathered
from the config, the run's summary, the saved model's sentence-transformers files and, for a CPR
export, its ``stats.json`` and card; `cpr_ray.cards.model_card` renders them.

A card rendered again (a rerun that finishes a run whose summary was not written) keeps the
model's evaluations: they are in its ledger (`cpr_ray.cards.evaluations`), or, for a card written
before the ledger, in the card's own table.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import posixpath
import re
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from cpr_ray.cards import evaluations as ledger
from cpr_ray.cards.model_card import (
    CardFacts,
    DataFacts,
    HardwareFacts,
    ProcedureFacts,
    render_card,
    split_card,
)
from cpr_ray.config import Config, TrainConfig
from cpr_ray.dataset.format import CARD, STATS, TRAIN_TABLE
from cpr_ray.errors import StorageError
from cpr_ray.runs.stage_runner import code_version
from cpr_ray.storage.store import Storage, join

# the public formats are English; a triplets file may be anything
FORMAT_LANGUAGE = {"cpr": "en", "msmarco": "en", "reasonir": "en", "specter": "en"}
EXPORT_RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")  # the export stage's run id
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
VERSIONED = ("sentence-transformers", "transformers", "torch", "ray")


def device_name(device: Any) -> str:
    """A torch device in words: the GPU's name, or the CPU's architecture."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine() or 'unknown'})"


def _read_json(storage: Storage, uri: str) -> dict[str, Any]:
    try:
        return storage.read_json(uri) if storage.is_file(uri) else {}
    except (OSError, ValueError):
        return {}


def _read_text(storage: Storage, uri: str) -> str | None:
    try:
        return storage.read_text(uri) if storage.is_file(uri) else None
    except (OSError, ValueError):
        return None


def hub_id(model: str) -> str | None:
    """`model` when it names a hub repository rather than a folder or a storage URI."""
    if "://" in model or model.startswith((".", "/", "~")) or os.path.exists(model):
        return None
    return model if HUB_ID.match(model) else None


def _versions() -> tuple[tuple[str, str], ...]:
    found = [("cpr-ray", code_version()), ("python", platform.python_version())]
    for name in VERSIONED:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return tuple(found)


def export_facts(storage: Storage, uri: str) -> DataFacts:
    """What the card says about a CPR export: its id, build, releases, counts and provenance,
    from its ``stats.json`` and its own card (either may be absent: a hand-made export)."""
    stats = _read_json(storage, join(uri, STATS))
    card = _read_text(storage, join(uri, CARD)) or ""
    name = posixpath.basename(uri.rstrip("/"))
    built = re.search(r"^Built (.+?) by cpr-ray (\S+?)\.?$", card, re.M)
    prov = stats.get("provenance") or {}
    release = "; ".join(
        x
        for x in (
            f"Semantic Scholar {prov['s2_releases']}" if prov.get("s2_releases") else "",
            f"OpenAlex topics {prov['openalex_snapshot']}" if prov.get("openalex_snapshot") else "",
        )
        if x
    )
    counts: list[tuple[str, float]] = []
    for split, s in (stats.get("splits") or {}).items():
        for key in ("queries", "positives", "negatives", "base_papers"):
            if key in s:
                counts.append((f"export: {split} {key.replace('_', ' ')}", s[key]))
    if "papers" in (stats.get("corpus") or {}):
        counts.append(("export: corpus papers", stats["corpus"]["papers"]))
    provenance = [
        (k, v)
        for k, v in (
            ("Semantic Scholar input", f"`{prov['s2']}`" if prov.get("s2") else ""),
            ("OpenAlex input", f"`{prov['openalex']}`" if prov.get("openalex") else ""),
            ("build config hash", f"`{prov['config_hash']}`" if prov.get("config_hash") else ""),
            ("built by", f"cpr-ray {prov['code_version']}" if prov.get("code_version") else ""),
            (
                "abstracts carried under",
                ", ".join(prov.get("open_licenses") or []),
            ),
        )
        if v
    ]
    for stage, s in (prov.get("stages") or {}).items():
        if s.get("model"):
            provenance.append(
                (
                    f"stage {stage}",
                    f"run {s.get('run_id')}, model {s['model']}"
                    + (f", prompt {s['prompt_version']}" if s.get("prompt_version") else ""),
                )
            )
    return DataFacts(
        format="cpr",
        uri=uri,
        table=TRAIN_TABLE,
        export_id=name if EXPORT_RUN_ID.match(name) else None,
        built=f"{built.group(1)} by cpr-ray {built.group(2)}" if built else None,
        release=release or None,
        counts=tuple(counts),
        provenance=tuple(provenance),
    )


def data_facts(
    storage: Storage, tc: TrainConfig, stats: Mapping[str, Any], examples: str
) -> DataFacts:
    """The training data: the run's counts (pairs, distinct queries and positives, rows read,
    dropped by reason) and, for an export, what its card and stats say."""
    import pyarrow.compute as pc

    uri = storage.resolve(str(stats.get("data") or tc.data)).uri
    base = export_facts(storage, uri) if tc.format == "cpr" else DataFacts(tc.format, uri)
    counts: list[tuple[str, float]] = [
        ("pairs trained on (query, positive)", stats.get("examples", 0))
    ]
    try:
        table = storage.read_parquet(examples, columns=["query", "positive_key"])
        counts += [
            ("distinct queries", pc.count_distinct(table.column("query")).as_py()),
            ("distinct positives", pc.count_distinct(table.column("positive_key")).as_py()),
        ]
    except (OSError, StorageError):
        pass
    counts += [("rows read", stats.get("rows_read", 0))]
    counts += [
        (f"dropped: {k.removeprefix('dropped_').replace('_', ' ')}", v)
        for k, v in stats.items()
        if k.startswith("dropped_") and v
    ]
    return DataFacts(
        format=base.format,
        uri=uri,
        table=base.table,
        export_id=base.export_id,
        built=base.built,
        release=base.release,
        counts=(*counts, *base.counts),
        provenance=base.provenance,
    )


def training_facts(
    storage: Storage,
    cfg: Config,
    summary: Mapping[str, Any],
    *,
    examples: str,
    device: str | None = None,
) -> CardFacts:
    """The facts of a finished run: the config, its summary (`run_train`'s), the saved model's
    sentence-transformers files, the examples it trained on (`examples`: their Parquet URI)."""
    from cpr_ray.retrieval.encoder import ST_POOLING_FLAGS, ST_POOLINGS

    tc, model_uri = cfg.train, str(summary["model"])
    st = _read_json(storage, join(model_uri, "config_sentence_transformers.json"))
    bert = _read_json(storage, join(model_uri, "sentence_bert_config.json"))
    pooling_cfg = _read_json(storage, join(model_uri, "1_Pooling", "config.json"))
    modes = [ST_POOLINGS.get(m, m) for f, m in ST_POOLING_FLAGS.items() if pooling_cfg.get(f)]
    prompts = st.get("prompts") or {}
    base = str(summary["base_model"])
    base_card = _read_text(storage, join(base, CARD)) if os.path.isdir(base) else None
    base_meta = (split_card(base_card) or ({}, ""))[0] if base_card else {}
    data = data_facts(storage, tc, summary.get("data") or {}, examples)
    peaks = summary.get("peak_memory_mb_per_worker") or []
    return CardFacts(
        name=f"{posixpath.basename(base.rstrip('/'))} fine-tuned on {data.label}",
        model_uri=model_uri,
        base_model=base,
        base_model_id=hub_id(base),
        pooling=", ".join(modes) or cfg.encoder.pooling,
        max_length=int(bert.get("max_seq_length") or tc.max_length),
        dim=pooling_cfg.get("word_embedding_dimension"),
        similarity=st.get("similarity_fn_name") or "cosine",
        query_prompt=prompts.get("query", summary.get("query_prefix", "")),
        document_prompt=prompts.get("document", summary.get("doc_prefix", "")),
        data=data,
        procedure=ProcedureFacts.from_run(tc, summary, bf16=tc.use_gpu and tc.bf16),
        hardware=HardwareFacts(
            workers=int(summary.get("workers", tc.workers)),
            cpus_per_worker=float(summary.get("cpus_per_worker") or tc.cpus_per_worker or 1),
            gpus_per_worker=1 if tc.use_gpu else 0,
            seconds=float(summary.get("seconds", 0.0)),
            peak_memory_mb=tuple(float(p) for p in peaks if p is not None),
            device=device,
            resources=dict(tc.resources_per_worker),
        ),
        versions=_versions(),
        created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        language=FORMAT_LANGUAGE.get(tc.format),
        license=base_meta.get("license") if isinstance(base_meta.get("license"), str) else None,
        mlflow=summary.get("mlflow"),
    )


def write_training_card(storage: Storage, facts: CardFacts) -> None:
    """Write ``README.md`` into the run's model folder (local or s3://). A card already there
    from an earlier finish of this run keeps its evaluations."""
    uri = join(facts.model_uri, CARD)
    # conditional, as recording an evaluation is: one landing meanwhile is kept, not overwritten
    storage.update_text(
        uri, lambda text: render_card(facts, ledger.read(storage, facts.model_uri, text))
    )
