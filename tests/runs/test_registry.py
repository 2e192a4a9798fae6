"""The stage registry (`cpr_ray.stages`) is the one declaration of the build: its graph holds,
every name and code reference in it exists, and everything that runs stages runs them in its
order. Manifests read as the typed record they are, old ones included, and write back the same
bytes."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from cpr_ray import stages as registry
from cpr_ray.config import Config, load_config
from cpr_ray.errors import ConfigError, StorageError
from cpr_ray.judge_check.gold import LABELS, gold_path, load_gold
from cpr_ray.judge_check.tasks import judged_label
from cpr_ray.llm.task import LLMTask
from cpr_ray.pipeline import build
from cpr_ray.pipeline.refresh import DOWNSTREAM
from cpr_ray.runs.stage_runner import manifest_uri, read_manifest, write_manifest
from cpr_ray.storage.settings import StorageConfig
from cpr_ray.storage.store import Storage


def _is_topological(order: tuple[str, ...] | list[str], stages: tuple[registry.Stage, ...]) -> bool:
    position = {name: i for i, name in enumerate(order)}
    return all(
        position[r] < position[s.name]
        for s in stages
        for r in s.reads
        if s.name in position and r in position
    )


def test_the_graph_is_acyclic_and_every_input_is_a_declared_stage():
    names = [s.name for s in registry.REGISTRY]
    assert len(names) == len(set(names)), "a stage is declared twice"
    for s in registry.REGISTRY:
        assert set(s.reads) <= set(names), f"{s.name} reads an undeclared stage"
    assert sorted(registry.build_order()) == sorted(names)  # raises on a cycle
    assert _is_topological(registry.STAGES, registry.REGISTRY)


def test_a_cycle_or_an_undeclared_input_is_refused():
    stages = list(registry.REGISTRY)
    ingest = dataclasses.replace(stages[0], reads=(registry.EXPORT,))  # ingest after export
    with pytest.raises(ConfigError, match="cycle"):
        registry.build_order([ingest, *stages[1:]])
    ghost = registry.Stage("toy", "tests.nowhere:run", reads=("no-such-stage",))
    with pytest.raises(ConfigError, match="toy reads no-such-stage, which is no stage"):
        registry.build_order([*stages, ghost])


def test_a_toy_stage_added_to_a_copy_lands_after_what_it_reads():
    """Declared first, it still comes after the stages it reads; nothing else is reordered."""
    toy = registry.Stage("toy", "tests.nowhere:run", reads=(registry.POOL, registry.MINE))
    order = registry.build_order((toy, *registry.REGISTRY))
    assert order.index("toy") == order.index(registry.POOL) + 1
    assert [n for n in order if n != "toy"] == list(registry.STAGES)
    assert _is_topological(order, (toy, *registry.REGISTRY))
    assert registry.upstream("toy", (toy, *registry.REGISTRY))[-2:] == (
        registry.SCORE_POSITIVES,
        registry.POOL,
    )


def test_every_code_reference_resolves_to_a_body_of_the_declared_shape():
    config_sections = set(Config.model_fields)
    for s in registry.REGISTRY:
        body = registry.resolve(s.run)
        assert list(inspect.signature(body).parameters)[:2] == ["run", "reads"], s.name
        if s.prepare is not None:
            assert callable(registry.resolve(s.prepare))
        assert set(s.config_sections) <= config_sections, s.name
        assert {k.split(".")[0] for k in s.resources.keys} <= config_sections, s.name


def test_every_llm_stage_names_tasks_and_gold_labels_that_exist():
    llm = load_config("dry-run").llm
    for name in registry.LLM_STAGES:
        s = registry.stage(name)
        assert llm.for_stage(name)  # llm.stages takes its key
        for task in s.tasks:
            cls = registry.resolve(task.cls)
            assert issubclass(cls, LLMTask) and cls.stage == name, task.cls
            if task.gold is None:
                continue
            assert gold_path(task.gold).is_file() and task.gold in LABELS
            assert cls.gold_label is not LLMTask.gold_label, f"{task.cls} names no gold label"
    assert set(registry.GOLD) == set(LABELS)


def test_a_gold_label_is_the_tasks_own_reading_of_its_answer():
    """Every label of every gold set, put in the answer columns its task derives, reads back as
    that label through the task's own `gold_label`; an unusable answer reads as none."""
    answers = {
        registry.JUDGE_ANALOGY: lambda label: {"decision": label},
        registry.JUDGE_TRANSFER: lambda label: {
            "verdict": "transfer" if label == "transfer" else "reject",
            "reject_reason": None if label == "transfer" else label,
        },
        registry.WRITE_QUERIES: lambda label: {"accept": label == "accept"},
        registry.DEDUP: lambda label: {"same_problem": label == "same"},
        registry.STRONGEST: lambda label: {"strongest_index": label, "model_choice": 7},
        registry.SCORE_POSITIVES: lambda label: {"usefulness": label},
        registry.JUDGE_NEGATIVES: lambda label: {"usefulness": label},
    }
    assert set(answers) == set(registry.GOLD)
    for gold, answer in answers.items():
        labels = {case.label for case in load_gold(gold)}
        assert len(labels) > 1, gold
        for label in labels:
            row = {"status": "ok", **answer(label)}
            assert judged_label(gold, row) == label, (gold, label)
            assert judged_label(gold, {**row, "status": "invalid"}) is None
    unchosen = {"status": "ok", "strongest_index": 9, "model_choice": None}
    assert judged_label(registry.STRONGEST, unchosen) is None  # names no candidate


def test_build_refresh_and_dry_run_run_the_registry_in_its_order():
    assert list(build.STAGES) == list(registry.STAGES)
    assert build.resolve_stages(None) == list(registry.STAGES)  # the dry run: every stage
    assert build.resolve_stages([registry.EXPORT, registry.MINE]) == [
        registry.MINE,
        registry.EXPORT,
    ]
    assert build.resolve_stages(DOWNSTREAM) == list(registry.STAGES[1:])  # all after ingest
    with pytest.raises(ConfigError, match="unknown stage"):
        build.resolve_stages(["judge_analogy"])


# an ingest manifest as the build before the registry published it, then a refresh committed
OLD_INGEST = {
    "code_version": "0.1.0+0ee69c6",
    "complete": True,
    "config_hash": "97fec2ead2a3b7b0",
    "corpus": {
        "applied": [],
        "base_release": "2026-11-25",
        "openalex_snapshot": "2026-11-01",
        "release": "2026-11-25",
    },
    "inputs": {"papers": "38187bc94c884158", "works": "fb2f9e88575e9661"},
    "lease": {"generation": 2, "id": "build-913aafdd"},
    "output": "/r/ingest/runs/20261207T123534Z-bce221",
    "refreshed": "2026-12-07T12:36:10+00:00",
    "run_id": "20261207T123534Z-bce221+2026-11-25+0",
    "seconds": 21.5,
    "stage": "ingest",
    "started": "2026-12-07T12:35:34.964876+00:00",
    "stats": {"citations": 7835, "duplicates": 0},
    "storage_retries": 0,
    "tables": {
        "papers": {
            "format": "lance",
            "layout": {"files": {"a.lance": 0}, "key": "corpus_id", "num_buckets": 4},
            "rows": 3684,
            "uri": "/r/ingest/runs/20261207T123534Z-bce221/papers.lance",
            "version": 1,
        },
        "venues": {"format": "parquet", "rows": 40, "uri": "/r/ingest/runs/x/venues.parquet"},
    },
}


def test_an_old_manifest_reads_as_the_record_and_writes_back_byte_for_byte(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    uri = manifest_uri(storage, registry.INGEST)
    storage.write_json(uri, OLD_INGEST)  # as the build before the registry wrote it
    before = (tmp_path / "ingest" / "_MANIFEST.json").read_bytes()
    manifest = read_manifest(storage, registry.INGEST)
    assert manifest == OLD_INGEST
    assert manifest["tables"]["papers"]["version"] == 1 and manifest["corpus"]["applied"] == []
    (tmp_path / "ingest" / "_MANIFEST.json").unlink()
    write_manifest(storage, manifest)
    assert (tmp_path / "ingest" / "_MANIFEST.json").read_bytes() == before


def test_a_file_that_is_no_manifest_stops_in_one_line(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    broken = {**OLD_INGEST, "tables": {"papers": {"rows": "many", "uri": "/r/p.lance"}}}
    storage.write_json(manifest_uri(storage, registry.MINE), broken)
    with pytest.raises(StorageError, match=r"mine/_MANIFEST.json is no stage manifest: tables"):
        read_manifest(storage, registry.MINE)
