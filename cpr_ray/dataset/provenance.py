"""Where an export came from, for its `stats.json` and its dataset card: the inputs, the OpenAlex
snapshot, each stage's run, model and prompt version, the pooling settings, the build's config
hash and the code version (read from the stages' manifests)."""

from __future__ import annotations

from typing import Any

from cpr_ray import stages as registry
from cpr_ray.config import Config
from cpr_ray.runs.stage_runner import Manifest, code_version, read_manifest
from cpr_ray.stages import EXPORT, INGEST
from cpr_ray.storage.store import Storage

# the stages an export is made from, and the config sections that decide them (the build's hash)
EXPORTED_FROM = registry.upstream(EXPORT)
BUILD_SECTIONS = tuple(
    dict.fromkeys(s for n in (*EXPORTED_FROM, EXPORT) for s in registry.stage(n).config_sections)
)


def provenance(cfg: Config, storage: Storage) -> dict[str, Any]:
    """Where the data came from: inputs, the OpenAlex snapshot, each stage's run, model and
    prompt version, the pooling settings, the build's config hash and the code version."""
    ingest: Manifest = read_manifest(storage, INGEST) or {}
    stages = {}
    for name in EXPORTED_FROM:
        m = read_manifest(storage, name)
        if m is not None:
            stages[name] = {
                "run_id": m["run_id"],
                "config_hash": m.get("config_hash"),
                "model": m.get("stats", {}).get("model"),
                "prompt_version": m.get("stats", {}).get("prompt_version"),
            }
    sections = [s for s in BUILD_SECTIONS if getattr(cfg, s) is not None]
    return {
        "s2": cfg.input.s2 if cfg.input else None,
        "openalex": cfg.input.openalex if cfg.input else None,
        "openalex_snapshot": (ingest.get("corpus") or {}).get("openalex_snapshot")
        or ingest.get("stats", {}).get("openalex_snapshot"),
        "s2_releases": s2_releases(ingest),
        "input_fingerprints": ingest.get("inputs", {}),
        "stages": stages,
        "pooling": cfg.pooling.model_dump(mode="json"),
        "open_licenses": list(cfg.dataset.open_licenses),
        "config_hash": cfg.section_hash(*sections),
        "config_sections": sections,
        "code_version": code_version(),
    }


def s2_releases(ingest: Manifest) -> str:
    """Which S2 releases the corpus covers: the bulk release and each refresh step applied."""
    corpus = ingest.get("corpus")
    if not corpus:
        return "release of the bulk shards (not refreshed)"
    steps = [s["step"] for s in corpus["applied"] if s["source"] == "s2"]
    return f"release {corpus['release']} (bulk {corpus['base_release']}" + (
        f", refreshed {'; '.join(steps)})" if steps else ")"
    )
