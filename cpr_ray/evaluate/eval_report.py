"""Results files -> one Markdown report and plots (`cpr report RESULTS… --out DIR`).

The report has the main table (one row per run: R@1/5/10 with the R@10 interval, MRR@10,
nDCG@10, R@10 relative to random), the per-domain Recall@10 table, the robustness table
(same-topic candidates removed), and, where a benchmark was run on several data variants (a pool
rebuilt without one pooler), Kendall's tau between the retrievers' orders. Plots: per benchmark,
bars of Recall@10 per domain (or of the primary metric per subset) for every run, with the
interval and a dashed line at random.
"""

from __future__ import annotations

import io
import posixpath
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from cpr_ray.config.search import retriever_label
from cpr_ray.evaluate.results import check_results
from cpr_ray.evaluate.robustness import order_agreement
from cpr_ray.retrieval.model_source import model_label
from cpr_ray.storage.store import Storage, StorageError, join

LABELS = {
    "recall_at_1": "R@1",
    "recall_at_5": "R@5",
    "recall_at_10": "R@10",
    "mrr_at_10": "MRR@10",
    "ndcg_at_10": "nDCG@10",
    "accuracy": "Acc",
}


def load_results(storage: Storage, uris: Sequence[str]) -> list[dict[str, Any]]:
    """Results files, or folders of them (every *.json inside)."""
    out = []
    for uri in uris:
        loc = storage.resolve(uri)
        if uri.endswith(".json"):
            files = [uri]
        else:
            files = [
                join(uri, posixpath.relpath(i.path, loc.path))
                for i in storage.list_files(uri, (".json",))
            ]
            if not files:
                raise StorageError(f"no results (*.json) under {uri}")
        for f in files:
            try:
                res = storage.read_json(f)
            except FileNotFoundError:
                raise StorageError(f"{f} does not exist") from None
            check_results(res, f)
            out.append(res)
    return out


def run_label(r: dict[str, Any]) -> str:
    label = retriever_label(r)
    if r.get("model"):
        label += f" {model_label(r['model'])}"
    if r.get("rewrite"):
        label += f" +{r['rewrite']}"
    if r.get("rerank"):
        label += f" +rerank-{r['rerank']}"
    return label


def bench_label(r: dict[str, Any]) -> str:
    sub = r.get("subset")
    return r["benchmark"] + (f":{sub}" if sub and "," not in sub else "")


def _ordered(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(results, key=lambda r: (bench_label(r), r.get("variant", ""), run_label(r)))


def _fmt(x: Any) -> str:
    return "–" if x is None else f"{x:.3f}"


def _ci(block: dict[str, Any]) -> str:
    return f"{block['value']:.3f} [{block['ci_low']:.3f}, {block['ci_high']:.3f}]"


def markdown(results: Sequence[dict[str, Any]], plots: Sequence[str] = ()) -> str:
    lines = ["# Evaluation report", ""]
    lines += [
        "| benchmark | variant | run | n | R@1 | R@5 | R@10 [95% CI] | MRR@10 | nDCG@10 | "
        "R@10 / random |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in _ordered(results):
        lines.append(
            f"| {bench_label(r)} | {r.get('variant', 'full')} | {run_label(r)} | "
            f"{r['n_queries']} | {_fmt(r['recall_at_1']['value'])} | "
            f"{_fmt(r['recall_at_5']['value'])} | {_ci(r['recall_at_10'])} | "
            f"{_fmt(r['mrr_at_10']['value'])} | {_fmt(r['ndcg_at_10']['value'])} | "
            f"{_fmt(r['recall_at_10']['vs_random'])}× |"
        )
    randoms = sorted(
        {
            (
                bench_label(r),
                round(r["recall_at_10"]["random"], 4),
                round(r["mrr_at_10"]["random"], 4),
            )
            for r in results
        }
    )
    lines += [
        "",
        "Random ranking: " + "; ".join(f"{b} R@10 {x:.3f}, MRR@10 {y:.3f}" for b, x, y in randoms),
    ]
    lines += _per_group_table(results, "per_domain", "Recall@10 per domain")
    lines += _per_group_table(results, "per_subset", "Per subset")
    lines += _robustness(results)
    lines += _variants(results)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _per_group_table(results: Sequence[dict[str, Any]], key: str, title: str) -> list[str]:
    with_groups = [r for r in results if r.get(key)]
    if not with_groups:
        return []
    metric = "recall_at_10" if key == "per_domain" else None
    groups = sorted({g for r in with_groups for g in r[key]})
    header = "| benchmark | variant | run | " + " | ".join(groups) + " |"
    lines = ["", f"## {title}", "", header, "|---|---|---|" + "---:|" * len(groups)]
    for r in _ordered(with_groups):
        m = metric or r.get("primary_metric", "recall_at_10")
        cells = [
            _fmt(r[key][g][m]["value"]) if g in r[key] and m in r[key][g] else "–" for g in groups
        ]
        lines.append(
            f"| {bench_label(r)} ({LABELS.get(m, m)}) | {r.get('variant', 'full')} | "
            f"{run_label(r)} | " + " | ".join(cells) + " |"
        )
    return lines


def _robustness(results: Sequence[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r.get("robustness", {}).get("without_same_topic")]
    if not rows:
        return []
    lines = [
        "",
        "## Robustness: same-topic candidates removed",
        "",
        "| benchmark | variant | run | pool | R@10 | random | R@10 / random | pool without | "
        "R@10 | random | R@10 / random |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in _ordered(rows):
        w = r["robustness"]["without_same_topic"]
        lines.append(
            f"| {bench_label(r)} | {r.get('variant', 'full')} | {run_label(r)} | "
            f"{r['n_candidates_mean']:.0f} | "
            f"{_fmt(r['recall_at_10']['value'])} | {_fmt(r['recall_at_10']['random'])} | "
            f"{_fmt(r['recall_at_10']['vs_random'])}× | {w['n_candidates_mean']:.0f} | "
            f"{_fmt(w['recall_at_10']['value'])} | {_fmt(w['recall_at_10']['random'])} | "
            f"{_fmt(w['recall_at_10']['vs_random'])}× |"
        )
    return lines


def variant_agreement(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per benchmark and non-full variant: Kendall's tau of run orders vs the full data."""
    by: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:
        metric = r.get("primary_metric", "recall_at_10")
        by[bench_label(r)][r.get("variant", "full")][run_label(r)] = r[metric]["value"]
    out = []
    for bench, variants in sorted(by.items()):
        full = variants.get("full")
        if not full:
            continue
        for name, scores in sorted(variants.items()):
            if name == "full" or len(set(full) & set(scores)) < 2:
                continue
            out.append({"benchmark": bench, "variant": name, **order_agreement(full, scores)})
    return out


def _variants(results: Sequence[dict[str, Any]]) -> list[str]:
    rows = variant_agreement(results)
    if not rows:
        return []
    lines = [
        "",
        "## Pool variants: retriever order vs the full pools",
        "",
        "| benchmark | variant | runs | Kendall's τ | max abs. change |",
        "|---|---|---:|---:|---:|",
    ]
    for a in rows:
        lines.append(
            f"| {a['benchmark']} | {a['variant']} | {len(a['retrievers'])} | "
            f"{a['kendall_tau']:.3f} | {a['max_abs_delta']:.3f} |"
        )
    return lines


def plot_benchmark(results: Sequence[dict[str, Any]]) -> bytes:
    """Grouped bars (PNG bytes): one group per domain/subset (+ all), one bar per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    first = results[0]
    key = (
        "per_domain"
        if first.get("per_domain")
        else "per_subset"
        if first.get("per_subset")
        else None
    )
    metric = "recall_at_10" if key != "per_subset" else first.get("primary_metric", "ndcg_at_10")
    groups = sorted({g for r in results for g in (r.get(key) or {})}) if key else []
    cats = [*groups, "all"]
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cats) + 2), 4.5))
    x = np.arange(len(cats))
    for i, r in enumerate(results):
        per_group = (r[key] or {}) if key else {}  # no key: no groups, only "all"
        blocks = [per_group.get(g, {}).get(metric) for g in groups] + [r[metric]]
        vals = [b["value"] if b else np.nan for b in blocks]
        lo = [max(0.0, b["value"] - b["ci_low"]) if b else 0 for b in blocks]
        hi = [max(0.0, b["ci_high"] - b["value"]) if b else 0 for b in blocks]
        ax.bar(
            x + (i - (len(results) - 1) / 2) * width,
            vals,
            width,
            yerr=[lo, hi],
            capsize=2,
            label=run_label(r),
        )
    rnd = first[metric]["random"]
    ax.axhline(rnd, color="black", linestyle="--", linewidth=1, label=f"random ({rnd:.3f})")
    ax.set_xticks(x, cats, rotation=20, ha="right")
    ax.set_ylabel(LABELS.get(metric, metric) + " (95% CI)")
    ax.set_title(
        f"{bench_label(first)} ({first.get('variant', 'full')}): {LABELS.get(metric, metric)}"
    )
    ax.set_ylim(0, 1 if max(r[metric]["ci_high"] for r in results) > 0.5 else None)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


def write_report(storage: Storage, results: Sequence[dict[str, Any]], out: str) -> list[str]:
    """Write report.md and one PNG per benchmark/variant under `out`; returns the URIs."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[(bench_label(r), r.get("variant", "full"))].append(r)
    written, names = [], []
    storage.make_dirs(out)
    for (bench, variant), rs in sorted(groups.items()):
        name = f"{bench.replace(':', '-')}-{variant}.png".replace("/", "_")
        uri = join(out, name)
        target = storage.resolve(uri)
        with target.fs.open_output_stream(target.path) as f:
            f.write(plot_benchmark(sorted(rs, key=run_label)))
        written.append(uri)
        names.append(name)
    md_uri = join(out, "report.md")
    target = storage.resolve(md_uri)
    with target.fs.open_output_stream(target.path) as f:
        f.write(markdown(results, names).encode())
    return [md_uri, *written]
