"""`cpr eval` and `cpr report` (registered on the main app in cpr_ray/cpr_command.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from cpr_ray.errors import UserError
from cpr_ray.evaluate.eval_config_check import check
from cpr_ray.runs.command_options import (
    Flag,
    Given,
    S3EndpointOpt,
    console,
    fail,
    with_flags,
)
from cpr_ray.storage.settings import StorageConfig

# `cpr eval`'s and jobs/evaluate.py's own flags (they win over --set, env and YAML)
EVAL_FLAGS = (
    Flag("eval.benchmark"),
    Flag("eval.data"),
    Flag("eval.retriever"),
    Flag("encoder.model", help="Model path or hub name (dense, splade, hybrid)"),
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


@with_flags(EVAL_FLAGS)
def eval_command(given: Given) -> None:
    """Evaluate a retriever (with an optional reranker or query rewriter) on a benchmark."""
    from cpr_ray.evaluate.eval_run import run_eval
    from cpr_ray.evaluate.publish import publish, show

    try:
        cfg = given.load(check=check)
        published = publish(cfg, run_eval(cfg))
    except UserError as exc:
        fail(exc)
    show(published)


def report_command(
    results: Annotated[list[str], typer.Argument(help="Results JSON files or folders of them.")],
    out: Annotated[str, typer.Option("--out", help="Folder for report.md and the plots.")],
    s3_endpoint: S3EndpointOpt = None,
) -> None:
    """Markdown table and plots across evaluation runs."""
    from cpr_ray.evaluate.eval_report import load_results, write_report
    from cpr_ray.storage.store import Storage

    try:
        storage = Storage(StorageConfig(root=out, s3_endpoint=s3_endpoint))
        loaded = load_results(storage, results)
        written = write_report(storage, loaded, out)
    except UserError as exc:
        fail(exc)
    console.print(f"{len(loaded)} run(s) → " + ", ".join(written), soft_wrap=True)
