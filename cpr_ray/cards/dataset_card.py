"""The export's dataset card (`README.md`): what the dataset is, its counts and shares against
the method's, licences, the leakage guarantee, and where every part came from.

A pure function of plain values: the export's statistics, its provenance
(`cpr_ray.dataset.provenance` gathers it) and the export's files (`ExportFiles`, which
`cpr_ray.dataset.format` fills in), so that this package imports no stage package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

PAPER_SHARES = {"crosses_field": 0.799, "crosses_domain": 0.453}


@dataclass(frozen=True)
class ExportFiles:
    """The export's tables and files as its format defines them, for the card to list."""

    eval_table: str
    train_table: str
    corpus_table: str
    files: Mapping[str, str]  # table -> its file's name
    schemas: Mapping[str, pa.Schema]  # table -> its Arrow schema
    stats: str  # the statistics file's name

    @property
    def tables(self) -> tuple[str, str, str]:
        return (self.eval_table, self.train_table, self.corpus_table)


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def dataset_card(
    stats: dict[str, Any], prov: dict[str, Any], created: str, export: ExportFiles
) -> str:
    """The export's README.md: what it is, counts, shares against the method's, licences,
    the leakage guarantee and provenance; its YAML header names the three tables as configs."""
    eval_name, train_name = export.eval_table, export.train_table
    ev, tr = stats["splits"][eval_name], stats["splits"][train_name]
    c = stats["corpus"]
    lines = [
        "---",
        "pretty_name: CPR (Cross-Pollination Retrieval)",
        "configs:",
        *(f"  - config_name: {t}\n    data_files: {export.files[t]}" for t in export.tables),
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
            for name, s in ((eval_name, ev), (train_name, tr))
        ),
        "",
        f"Queries held out of CPR-train because their base paper or positive is in CPR-eval: "
        f"{stats['held_out_queries']:,}. Corpus: {c['papers']:,} papers.",
        "",
        "### Per field",
        "",
        f"| field | {eval_name} | {train_name} |",
        "|---|---:|---:|",
        *_per_key_rows(ev["per_field"], tr["per_field"]),
        "",
        "### Per domain",
        "",
        f"| domain | {eval_name} | {train_name} |",
        "|---|---:|---:|",
        *_per_key_rows(ev["per_domain"], tr["per_domain"]),
        "",
        "## Positives from another field or domain",
        "",
        f"| | all | {eval_name} | {train_name} | the method's dataset |",
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
            f"| `{export.files[t]}` | "
            + ", ".join(f"`{f.name}` {f.type}" for f in export.schemas[t])
            + " |"
            for t in export.tables
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
        f"- Pooling: {_poolers(prov['pooling'])} (all settings in `{export.stats}`)",
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
