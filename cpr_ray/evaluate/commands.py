"""`cpr eval` and `cpr report` (registered on the main app in cpr_ray/cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from cpr_ray.config import ConfigError
from cpr_ray.evaluate.metrics import METRICS
from cpr_ray.evaluate.protocols import LLMLayerMissing
from cpr_ray.storage import StorageError

console = Console()
USER_ERRORS = (ConfigError, StorageError, LLMLayerMissing, ValueError)


def _fail(exc: Exception) -> None:
    console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
    raise typer.Exit(2)


def settings_from(config: Path | None, flags: dict[str, Any]):
    """EvalSettings from an optional YAML file, overridden by the flags that were given."""
    from cpr_ray.evaluate.settings import EvalSettings, describe_errors

    data: dict[str, Any] = {}
    if config is not None:
        if not config.is_file():
            raise ConfigError(f"config file not found: {config}")
        data = yaml.safe_load(config.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {config} must hold a mapping")
    for key, value in flags.items():  # "ray.num_cpus" sets a key of a section
        if value is None:
            continue
        *sections, leaf = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {section!r} is a value, not a section")
        node[leaf] = value
    try:
        return EvalSettings.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_errors(err)) from None


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
        str | None, typer.Option("--benchmark", help="cpr | beir | analobench | bright")
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
    s3_endpoint: Annotated[
        str | None, typer.Option("--s3-endpoint", help="S3-compatible endpoint.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML file of eval settings.")
    ] = None,
) -> None:
    """Evaluate a retriever (with an optional reranker or query rewriter) on a benchmark."""
    from cpr_ray.evaluate.results import write_results
    from cpr_ray.evaluate.runner import run_eval
    from cpr_ray.storage import Storage

    flags = {
        "benchmark": benchmark,
        "data": data,
        "retriever": retriever,
        "model": model,
        "subset": subset,
        "rerank": rerank,
        "rewrite": rewrite,
        "out": out,
        "variant": variant,
        "pooling": pooling,
        "query_prefix": query_prefix,
        "max_length": max_length,
        "search_backend": search_backend,
        "top_k": top_k,
        "seed": seed,
        "gain": gain,
        "s3_endpoint": s3_endpoint,
    }
    try:
        settings = settings_from(config, flags)
        results = run_eval(settings)
        uri = (
            write_results(Storage(settings.storage()), settings.out, results)
            if settings.out
            else None
        )
    except USER_ERRORS as exc:
        _fail(exc)
    print_results(results)
    if uri:
        console.print(f"results → {uri}", soft_wrap=True)


def report_command(
    results: Annotated[list[str], typer.Argument(help="Results JSON files or folders of them.")],
    out: Annotated[str, typer.Option("--out", help="Folder for report.md and the plots.")],
    s3_endpoint: Annotated[
        str | None, typer.Option("--s3-endpoint", help="S3-compatible endpoint.")
    ] = None,
) -> None:
    """Markdown table and plots across evaluation runs."""
    from cpr_ray.config import StorageConfig
    from cpr_ray.evaluate.report import load_results, write_report
    from cpr_ray.storage import Storage

    try:
        storage = Storage(StorageConfig(root=out, s3_endpoint=s3_endpoint))
        loaded = load_results(storage, results)
        written = write_report(storage, loaded, out)
    except USER_ERRORS as exc:
        _fail(exc)
    console.print(f"{len(loaded)} run(s) → " + ", ".join(written), soft_wrap=True)
