"""`cpr eval` and `cpr report` (registered on the main app in cpr_ray/cli.py)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from cpr_ray.command_line import (
    ConfigOpt,
    Flag,
    ProfileOpt,
    S3EndpointOpt,
    SetOpt,
    command_config,
    console,
    fail,
    with_flags,
)
from cpr_ray.errors import UserError
from cpr_ray.evaluate.metrics import METRICS
from cpr_ray.evaluate.settings import check
from cpr_ray.storage import StorageConfig

# `cpr eval`'s and jobs/evaluate.py's own flags (they win over --set, env and YAML)
EVAL_FLAGS = (
    Flag("eval.benchmark"),
    Flag("eval.data"),
    Flag("eval.retriever"),
    Flag("encoder.model", help="Model path or hub name (dense, splade)"),
    Flag("eval.subset"),
    Flag("eval.rerank"),
    Flag("eval.rewrite"),
    Flag("eval.out"),
    Flag("eval.variant"),
    Flag("encoder.pooling"),
    Flag("encoder.query_prefix"),
    Flag("encoder.max_length"),
    Flag("eval.search_backend"),
    Flag("eval.top_k"),
    Flag("eval.seed"),
    Flag("eval.gain"),
    Flag("storage.s3_endpoint"),
)


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


@with_flags(EVAL_FLAGS)
def eval_command(
    flags: dict[str, Any],
    config: ConfigOpt = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Evaluate a retriever (with an optional reranker or query rewriter) on a benchmark."""
    from cpr_ray.evaluate.mteb_results import mteb_result_uri
    from cpr_ray.evaluate.results import write_results
    from cpr_ray.evaluate.runner import run_eval
    from cpr_ray.storage import Storage
    from cpr_ray.train.model_card import record_evaluation

    try:
        cfg = command_config(profile, config, set_, flags, check=check)
        results = run_eval(cfg)
        uri = write_results(Storage(cfg.storage), cfg.eval.out, results) if cfg.eval.out else None
        # a model folder whose card cpr train wrote gets these results appended (model_card.py)
        card = record_evaluation(Storage(cfg.storage), cfg.encoder.model, results)
    except UserError as exc:
        fail(exc)
    print_results(results)
    if uri:
        console.print(f"results → {uri}", soft_wrap=True)
        mteb_uri = mteb_result_uri(uri, results)  # write_results wrote it too
        if mteb_uri:
            console.print(f"MTEB format → {mteb_uri}", soft_wrap=True)
    if card:
        console.print(f"model card → {card}", soft_wrap=True)


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
