"""The export's dataset card (`README.md`): what the dataset is, its counts and shares against
the method's, licences, the leakage guarantee, and where every part came from (`provenance`)."""

from __future__ import annotations

from typing import Any

from cpr_ray.config import Config
from cpr_ray.dataset.format import (
    CORPUS_TABLE,
    EVAL_TABLE,
    SCHEMAS,
    STATS,
    TRAIN_TABLE,
    file_name,
)
from cpr_ray.dataset.negatives import STAGE as NEGATIVES_STAGE
from cpr_ray.queries.stages import STAGES as POSITIVE_STAGES
from cpr_ray.stage import code_version, read_manifest
from cpr_ray.storage import Storage

PAPER_SHARES = {"crosses_field": 0.799, "crosses_domain": 0.453}
BUILD_SECTIONS = ("input", "ingest", "mining", "llm", "pooling", "dataset")


def provenance(cfg: Config, storage: Storage) -> dict[str, Any]:
    """Where the data came from: inputs, the OpenAlex snapshot, each stage's run, model and
    prompt version, the pooling settings, the build's config hash and the code version."""
    ingest = read_manifest(storage, "ingest") or {}
    stages = {}
    for name in ("ingest", "venues", "mine", *POSITIVE_STAGES, "pool", NEGATIVES_STAGE):
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


def s2_releases(ingest: dict[str, Any]) -> str:
    """Which S2 releases the corpus covers: the bulk release and each refresh step applied."""
    corpus = ingest.get("corpus")
    if not corpus:
        return "release of the bulk shards (not refreshed)"
    steps = [s["step"] for s in corpus["applied"] if s["source"] == "s2"]
    return f"release {corpus['release']} (bulk {corpus['base_release']}" + (
        f", refreshed {'; '.join(steps)})" if steps else ")"
    )


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def dataset_card(stats: dict[str, Any], prov: dict[str, Any], created: str) -> str:
    """The export's README.md: what it is, counts, shares against the method's, licences,
    the leakage guarantee and provenance; its YAML header names the three tables as configs."""
    ev, tr = stats["splits"][EVAL_TABLE], stats["splits"][TRAIN_TABLE]
    c = stats["corpus"]
    lines = [
        "---",
        "pretty_name: CPR (Cross-Pollination Retrieval)",
        "configs:",
        *(
            f"  - config_name: {t}\n    data_files: {file_name(t)}"
            for t in (EVAL_TABLE, TRAIN_TABLE, CORPUS_TABLE)
        ),
        "---",
        "",
        "# CPR: Cross-Pollination Retrieval",
        "",
        'Research problems, each a "How to …" query written from a base paper, paired with a '
        "paper on other topics whose contribution carries over to solve it (the positive), and "
        "hard negatives from the same candidate pools judged not useful for it. Each CPR-eval "
        "query ranks its own candidates; CPR-train pairs carry negatives for contrastive "
        "training. Texts are resolved through `corpus`.",
        "",
        f"Built {created} by cpr-ray {prov['code_version']}.",
        "",
        "## Counts",
        "",
        "| split | queries | base papers | positives | negatives | negatives per query "
        "(mean, min) | queries short of negatives |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {s['queries']:,} | {s['base_papers']:,} | {s['positives']:,} | "
            f"{s['negatives']:,} | {s['negatives_per_query_mean']}, "
            f"{s['negatives_per_query_min']} | {s['queries_short_of_negatives']:,} |"
            for name, s in ((EVAL_TABLE, ev), (TRAIN_TABLE, tr))
        ),
        "",
        f"Queries held out of CPR-train because their base paper or positive is in CPR-eval: "
        f"{stats['held_out_queries']:,}. Corpus: {c['papers']:,} papers.",
        "",
        "### Per field",
        "",
        f"| field | {EVAL_TABLE} | {TRAIN_TABLE} |",
        "|---|---:|---:|",
        *_per_key_rows(ev["per_field"], tr["per_field"]),
        "",
        "### Per domain",
        "",
        f"| domain | {EVAL_TABLE} | {TRAIN_TABLE} |",
        "|---|---:|---:|",
        *_per_key_rows(ev["per_domain"], tr["per_domain"]),
        "",
        "## Positives from another field or domain",
        "",
        f"| | all | {EVAL_TABLE} | {TRAIN_TABLE} | the method's dataset |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| another {what} | {percent(stats[f'share_crosses_{what}'])} | "
            f"{percent(ev[f'share_crosses_{what}'])} | {percent(tr[f'share_crosses_{what}'])} | "
            f"{percent(PAPER_SHARES[f'crosses_{what}'])} |"
            for what in ("field", "domain")
        ),
        "",
        "## Files",
        "",
        "| file | columns |",
        "|---|---|",
        *(
            f"| `{file_name(t)}` | " + ", ".join(f"`{f.name}` {f.type}" for f in SCHEMAS[t]) + " |"
            for t in (EVAL_TABLE, TRAIN_TABLE, CORPUS_TABLE)
        ),
        "",
        "`candidate_ids` is the positive followed by its hard negatives in pool order "
        "(group by group: shares_query_topic, shares_positive_topic, other; within a group, "
        "in the order pooling ranked them); `candidate_groups` labels each (`positive` first).",
        "",
        "## Abstracts and licences",
        "",
        f"Abstracts are included only under {', '.join(prov['open_licenses'])}: "
        f"{c['abstracts_included']:,} included, {c['abstracts_withheld']:,} withheld (their "
        f"rows carry ids, title and licence), {c['without_abstract']:,} papers have none. Fill "
        "the withheld ones from your own copy of the Semantic Scholar `abstracts` dataset:",
        "",
        "```",
        "cpr hydrate EXPORT_DIR --s2 S2_RELEASE_URI",
        "```",
        "",
        "## No leakage",
        "",
        "No base paper or positive of a CPR-eval query appears anywhere in CPR-train: not as a "
        "query's base paper, a positive or a negative. This was checked on these files before "
        "they were published.",
        "",
        "## Provenance",
        "",
        f"- Semantic Scholar input: `{prov['s2']}`; {prov['s2_releases']}",
        f"- OpenAlex input: `{prov['openalex']}` (topics from {prov['openalex_snapshot']})",
        f"- Input fingerprints: {_inline(prov['input_fingerprints'])}",
        f"- Pooling: {_poolers(prov['pooling'])} (all settings in `{STATS}`)",
        f"- Build config hash: `{prov['config_hash']}` "
        f"(sections {', '.join(prov['config_sections'])})",
        "",
        "| stage | run | model | prompt version |",
        "|---|---|---|---|",
        *(
            f"| {name} | {s['run_id']} | {s['model'] or ''} | {s['prompt_version'] or ''} |"
            for name, s in prov["stages"].items()
        ),
        "",
    ]
    return "\n".join(lines)


def _per_key_rows(a: dict[str, int], b: dict[str, int]) -> list[str]:
    return [f"| {k} | {a.get(k, 0):,} | {b.get(k, 0):,} |" for k in sorted(set(a) | set(b))]


def _poolers(pooling: dict[str, Any]) -> str:
    """The pooling retrievers as `name (kind, model)`, and the list depth."""
    names = [
        f"{p.get('name')} ({p.get('kind')}"
        + (f", {p['encoder'].get('model')})" if p.get("encoder") else ")")
        for p in pooling.get("poolers", [])
    ]
    return f"{', '.join(names) or 'none recorded'}; top {pooling.get('top_k')} per group"


def _inline(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} `{v}`" for k, v in d.items()) or "none recorded"
