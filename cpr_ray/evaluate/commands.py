"""`cpr eval` and `cpr report` (registered on the main app in cpr_ray/cli.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cpr_ray.command_line import ConfigOpt, ProfileOpt, S3EndpointOpt, SetOpt, console, fail
from cpr_ray.config import Config, load_config
from cpr_ray.errors import UserError
from cpr_ray.evaluate.metrics import METRICS
from cpr_ray.evaluate.settings import check
from cpr_ray.storage import StorageConfig

# `cpr eval` / jobs/evaluate.py flag -> the config key it sets (flags win over --set and YAML)
EVAL_FLAGS = {
    "benchmark": "eval.benchmark",
    "data": "eval.data",
    "retriever": "eval.retriever",
    "model": "encoder.model",
    "subset": "eval.subset",
    "rerank": "eval.rerank",
    "rewrite": "eval.rewrite",
    "out": "eval.out",
    "variant": "eval.variant",
    "pooling": "encoder.pooling",
    "query_prefix": "encoder.query_prefix",
    "max_length": "encoder.max_length",
    "search_backend": "eval.search_backend",
    "top_k": "eval.top_k",
    "seed": "eval.seed",
    "gain": "eval.gain",
    "s3_endpoint": "storage.s3_endpoint",
}


def eval_config(
    profile: str | None,
    config: Path | None,
    overrides: Sequence[str],
    flags: Mapping[str, Any],
) -> Config:
    """The one config tree for an evaluation: profile < YAML < CPR_* env < --set < flags."""
    cfg = load_config(
        profile, config, overrides, flags={EVAL_FLAGS[k]: v for k, v in flags.items()}
    )
    check(cfg)
    return cfg


def print_results(res: dict[str, Any]) -> None:
    table = Table(
        title=f"{res['benchmark']} {res.get('subset') or ''} · {res['retriever']} "
        f"{res.get('model') or ''} · {res['n_queries']} queries",
        title_justify="left",
    )
    for col in ("metric", "value", "95% CI", "random", "× random"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for m in ("accuracy", *METRICS) if "accuracy" in res else METRICS:
        b = res[m]
        vs = "" if b["vs_random"] is None else f"{b['vs_random']:.1f}"
        table.add_row(
            m,
            f"{b['value']:.3f}",
            f"[{b['ci_low']:.3f}, {b['ci_high']:.3f}]",
            f"{b['random']:.3f}",
            vs,
        )
    console.print(table)
    timing = ", ".join(f"{k} {v:.1f}" for k, v in res["timing"].items())
    console.print(f"seconds: {timing}")
    if res.get("input_rejects"):
        console.print(
            f"[yellow]{len(res['input_rejects'])} input record(s) rejected[/] "
            "(listed under input_rejects in the results)"
        )


def eval_command(
    benchmark: Annotated[
        str | None,
        typer.Option(
            "--benchmark", help="cpr | cpr-full (whole corpus) | beir | analobench | bright"
        ),
    ] = None,
    data: Annotated[str | None, typer.Option("--data", help="URI of the benchmark files.")] = None,
    retriever: Annotated[
        str | None, typer.Option("--retriever", help="bm25 | dense | splade")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model path or hub name (dense, splade).")
    ] = None,
    subset: Annotated[
        str | None,
        typer.Option(
            "--subset",
            help="AnaloBench t2|t2-stories-10|…|t1; BRIGHT subsets; "
            "BEIR qrels split; CPR split table.",
        ),
    ] = None,
    rerank: Annotated[
        str | None, typer.Option("--rerank", help="llm: the tournament reranker.")
    ] = None,
    rewrite: Annotated[
        str | None, typer.Option("--rewrite", help="hyde | query2doc | rag-fusion")
    ] = None,
    out: Annotated[
        str | None, typer.Option("--out", help="Results JSON file or folder (path or s3://…).")
    ] = None,
    variant: Annotated[
        str | None, typer.Option("--variant", help="Data variant label (default: full).")
    ] = None,
    pooling: Annotated[
        str | None, typer.Option("--pooling", help="auto | mean | cls | last_token")
    ] = None,
    query_prefix: Annotated[
        str | None, typer.Option("--query-prefix", help="Query instruction.")
    ] = None,
    max_length: Annotated[int | None, typer.Option("--max-length", help="Tokens per text.")] = None,
    search_backend: Annotated[
        str | None, typer.Option("--search-backend", help="numpy | faiss")
    ] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Corpus search depth.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed (ties, bootstrap).")] = None,
    gain: Annotated[
        str | None,
        typer.Option("--gain", help="nDCG gain: exponential (2^rel-1) or linear (trec_eval)."),
    ] = None,
    s3_endpoint: S3EndpointOpt = None,
    config: ConfigOpt = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Evaluate a retriever (with an optional reranker or query rewriter) on a benchmark."""
    from cpr_ray.evaluate.results import write_results
    from cpr_ray.evaluate.runner import run_eval
    from cpr_ray.storage import Storage

    flags = {k: v for k, v in locals().items() if k in EVAL_FLAGS}
    try:
        cfg = eval_config(profile, config, set_ or [], flags)
        results = run_eval(cfg)
        uri = write_results(Storage(cfg.storage), cfg.eval.out, results) if cfg.eval.out else None
    except UserError as exc:
        fail(exc)
    print_results(results)
    if uri:
        console.print(f"results → {uri}", soft_wrap=True)


def report_command(
    results: Annotated[list[str], typer.Argument(help="Results JSON files or folders of them.")],
    out: Annotated[str, typer.Option("--out", help="Folder for report.md and the plots.")],
    s3_endpoint: S3EndpointOpt = None,
) -> None:
    """Markdown table and plots across evaluation runs."""
    from cpr_ray.evaluate.report import load_results, write_report
    from cpr_ray.storage import Storage

    try:
        storage = Storage(StorageConfig(root=out, s3_endpoint=s3_endpoint))
        loaded = load_results(storage, results)
        written = write_report(storage, loaded, out)
    except UserError as exc:
        fail(exc)
    console.print(f"{len(loaded)} run(s) → " + ", ".join(written), soft_wrap=True)
