"""`cpr`: the command line over the stages (the jobs in jobs/ call the same functions)."""

from __future__ import annotations

import gc
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from cpr_ray import stages as registry
from cpr_ray.config import load_config
from cpr_ray.errors import ConfigError, StorageError, UserError
from cpr_ray.evaluate.eval_commands import eval_command, report_command
from cpr_ray.judge_check.command import judge_check_command
from cpr_ray.llm.spend_ledger import ledger_summary
from cpr_ray.pipeline.build import manifests_table, run_build
from cpr_ray.pipeline.dry_run import run_dry_run
from cpr_ray.pipeline.refresh import refresh as refresh_corpus
from cpr_ray.pipeline.refresh import summary_lines
from cpr_ray.runs.command_options import (
    ConfigOpt,
    LLMModelOpt,
    LLMUrlOpt,
    ProfileOpt,
    S3EndpointOpt,
    SetOpt,
    console,
    fail,
    report_crash,
)
from cpr_ray.runs.stage_runner import read_manifest
from cpr_ray.search.search_commands import index_command, search_command, serve_command
from cpr_ray.storage.store import Storage
from cpr_ray.train.train_command import train_command


class _Cpr(typer.Typer):
    """The `cpr` app, whose bugs end like a job's: the traceback, then one line with the cause
    and where the failure record went (exit 1)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as done:
            if not done.code:
                # the command finished: what it loaded (torch, transformers, Ray, Lance) stays
                # out of the cycle collector's last passes at exit, which took 2-6 s after every
                # command that loaded a model on 2 busy cores. atexit handlers (Ray's shutdown),
                # thread joins and reference-counted teardown all still run. A command stopped
                # by Ctrl-C or an error exits as it always did, collector included: what it
                # left in flight (a hanging request's client) is released the usual way
                gc.freeze()
            raise
        except Exception as exc:
            sys.exit(report_crash(exc))


app = _Cpr(
    help="Cross-Pollination Retrieval on Ray: build the dataset, train and evaluate retrievers, "
    "search a corpus for ideas from other fields.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

ForceOpt = Annotated[bool, typer.Option("--force", help="Rerun stages even if already published.")]


def _llm_overrides(base_url: str | None, model: str | None) -> list[str]:
    out = [f"llm.base_url={base_url}"] if base_url else []
    return out + ([f"llm.model={model}"] if model else [])


@app.command("dry-run")
def dry_run(
    out: Annotated[Path, typer.Option("--out", help="Local folder for the build.")] = Path(
        "cpr-dry-run"
    ),
    force: ForceOpt = False,
    llm_base_url: LLMUrlOpt = None,
    llm_model: LLMModelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run every stage on the bundled sample, locally, and show what each did."""
    started = time.time()
    try:
        run_dry_run(
            out.resolve(), [*_llm_overrides(llm_base_url, llm_model), *(set_ or [])], force=force
        )
    except UserError as exc:
        fail(exc)
    console.print(
        f"dry run finished in {time.time() - started:.0f}s; inspect with: cpr stats {out}"
    )


@app.command()
def build(
    config: ConfigOpt = None,
    profile: ProfileOpt = None,
    stages: Annotated[
        str | None,
        typer.Option("--stages", help=f"Comma-separated subset of: {', '.join(registry.STAGES)}"),
    ] = None,
    force: ForceOpt = False,
    llm_base_url: LLMUrlOpt = None,
    llm_model: LLMModelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run the build stages (all, or --stages) with a config file and/or profile."""
    if config is None and profile is None:
        fail(ConfigError("give --config FILE and/or --profile NAME"))
    try:
        cfg = load_config(
            profile, config, [*_llm_overrides(llm_base_url, llm_model), *(set_ or [])]
        )
        names = registry.select([s.strip() for s in stages.split(",")] if stages else None)
        manifests = run_build(cfg, names, force=force)
    except UserError as exc:
        fail(exc)
    console.print(manifests_table(manifests))


@app.command()
def refresh(
    config: ConfigOpt = None,
    profile: ProfileOpt = None,
    corpus_only: Annotated[
        bool,
        typer.Option("--corpus-only", help="Apply the diffs to the corpus; rerun no stage."),
    ] = False,
    llm_base_url: LLMUrlOpt = None,
    llm_model: LLMModelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Apply Semantic Scholar's diffs since the last refresh to the corpus, then rerun the
    later stages, paying only for new and changed pairs (API key in $S2_API_KEY)."""
    if config is None and profile is None:
        fail(ConfigError("give --config FILE and/or --profile NAME"))
    extra = ["refresh.downstream=false"] if corpus_only else []
    try:
        cfg = load_config(
            profile, config, [*_llm_overrides(llm_base_url, llm_model), *(set_ or []), *extra]
        )
        summary = refresh_corpus(cfg)
    except UserError as exc:
        fail(exc)
    for line in summary_lines(summary):
        console.print(line, soft_wrap=True)


@app.command()
def stats(
    root: Annotated[str, typer.Argument(help="Build root (path or s3://…).")],
    s3_endpoint: S3EndpointOpt = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Config whose llm.prices give the cost.")
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Follow a running build or refresh (state, rows done of rows to do, ETA, LLM "
            "spend so far) until it ends; reads the root only, no Ray connection.",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between looks (--watch).")
    ] = 5.0,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Every stage's whole manifest, the LLM ledger and failures, as JSON."
        ),
    ] = False,
    stage: Annotated[
        str | None,
        typer.Option(
            "--stage", help="One stage's whole manifest (tables, timings, stats) as JSON."
        ),
    ] = None,
) -> None:
    """A build's published stages on one screen (rows, seconds, one line of figures each), its
    LLM spend and each stage's last failure that no success followed; --stage NAME or --json
    for every figure; with --watch, a running build's progress."""
    import json

    from cpr_ray.pipeline.stats_view import full_stats, stages_table, summary_line
    from cpr_ray.runs import failures
    from cpr_ray.storage.settings import StorageConfig

    storage = Storage(StorageConfig(root=root, s3_endpoint=s3_endpoint))
    if watch and (as_json or stage):
        fail(ConfigError("--watch follows a running build; --json and --stage read a finished one"))
    if stage is not None and stage.replace("_", "-") not in registry.STAGES:
        fail(ConfigError(f"--stage {stage}: no such stage; stages: {', '.join(registry.STAGES)}"))
    if watch:
        _watch(storage, interval)
        return
    if stage is not None:
        name = stage.replace("_", "-")
        try:
            manifest = read_manifest(storage, name)
        except UserError as exc:
            fail(exc)
        if manifest is None:
            fail(StorageError(f"{name} has published nothing under {root}"))
        print(json.dumps(manifest, indent=2, ensure_ascii=False))
        return
    try:
        llm_cfg = load_config(file=config).llm if config else None
        manifests = {n: m for n in registry.STAGES if (m := read_manifest(storage, n)) is not None}
        ledger = ledger_summary(storage, llm_cfg)
        failed = failures.last_failures(storage, manifests)
    except UserError as exc:
        fail(exc)
    if not manifests and not failed:
        fail(StorageError(f"no published stage under {root}"))
    if as_json:
        print(json.dumps(full_stats(manifests, ledger, failed), indent=2, ensure_ascii=False))
        return
    if manifests:
        console.print(stages_table(manifests))
    # the terminal's width as the shell states it (COLUMNS first): rich's console falls back to
    # 80 columns wherever it takes its stream for a dumb terminal
    width = shutil.get_terminal_size().columns
    for name, m in manifests.items():
        console.print(summary_line(name, m, width), soft_wrap=True, highlight=False)
    if ledger:
        table = Table(title="LLM ledger (all runs)", title_justify="left", box=box.SIMPLE_HEAD)
        cols = (
            "stage",
            "rows",
            "calls",
            "ok",
            "invalid",
            "failed",
            "prompt_tokens",
            "completion_tokens",
            "cached_prompt_tokens",
            "cost_usd",
            "fleet_usd",
        )
        for col in cols:
            table.add_column(col, justify="left" if col == "stage" else "right")
        for row in ledger:
            table.add_row(
                *[
                    "n/a"
                    if row[c] is None
                    else (f"{row[c]:,}" if isinstance(row[c], int) else str(row[c]))
                    for c in cols
                ]
            )
        console.print(table)
    for f in failed:
        console.print(
            f"[bold red]last failure[/] of {f.stage} at {f.time} ({f.kind}): "
            + escape(f"{f.cause}; traceback in {f.log}"),
            soft_wrap=True,
            highlight=False,
        )


def _watch(storage: Storage, interval: float) -> None:
    """Show the build's progress every `interval` seconds until no build or refresh owns the
    root, then once more (the final state): redrawn in place on a terminal, one snapshot after
    another, when they change, in a log."""
    from rich.console import Group
    from rich.live import Live

    from cpr_ray.pipeline.watch import snapshot, spend_line, watch_table

    def view() -> tuple[Group, bool, str]:
        snap = snapshot(storage)
        shown = Group(watch_table(snap), spend_line(snap))
        with console.capture() as text:
            console.print(shown)
        return shown, snap.running, text.get()

    try:
        first = snapshot(storage)
        if not (first.running or first.manifests or first.progress):  # a typo in ROOT, say
            raise StorageError(f"no build under {storage.root}: nothing published, nothing running")
        shown, running, text = view()
        if not console.is_terminal:
            console.print(shown)
            while running:
                time.sleep(interval)
                shown, running, now = view()
                if now != text:
                    console.print(shown)
                    text = now
            return
        with Live(shown, console=console, auto_refresh=False) as live:
            while running:
                time.sleep(interval)
                shown, running, _ = view()
                live.update(shown, refresh=True)
    except UserError as exc:
        fail(exc)


@app.command()
def hydrate(
    export: Annotated[str, typer.Argument(help="Export folder (path or s3://…).")],
    s2: Annotated[
        str, typer.Option("--s2", help="Your S2 release (or its abstracts/ folder), path or s3://…")
    ],
    s3_endpoint: S3EndpointOpt = None,
) -> None:
    """Fill the abstracts an export leaves out (licence) from your own S2 abstracts shards."""
    from cpr_ray.dataset.hydrate import hydrate as fill_abstracts
    from cpr_ray.storage.settings import StorageConfig

    try:
        out = fill_abstracts(Storage(StorageConfig(s3_endpoint=s3_endpoint)), export, s2)
    except UserError as exc:
        fail(exc)
    console.print(
        f"{out['filled']:,} of {out['missing']:,} missing abstracts filled from "
        f"{out['shards']:,} shard(s); {out['still_missing']:,} still missing → {out['corpus']}",
        soft_wrap=True,
    )


@app.command("to-beir")
def to_beir(
    export: Annotated[str, typer.Argument(help="Export folder (path or s3://…).")],
    out: Annotated[str, typer.Argument(help="Folder for the BEIR files (path or s3://…).")],
    s3_endpoint: S3EndpointOpt = None,
) -> None:
    """Write an export as BEIR files (corpus.jsonl, queries.jsonl, qrels/test.tsv and train.tsv)
    for Pyserini, BEIR and MTEB; `cpr eval --benchmark beir` on them equals `cpr-full`."""
    from cpr_ray.evaluate.beir_export import write_beir
    from cpr_ray.storage.settings import StorageConfig

    try:
        done = write_beir(Storage(StorageConfig(s3_endpoint=s3_endpoint)), export, out)
    except UserError as exc:
        fail(exc)
    rejected = f"; {len(done['rejects']):,} eval record(s) rejected" if done["rejects"] else ""
    console.print(
        f"{done['documents']:,} documents, {done['test_queries']:,} test and "
        f"{done['train_queries']:,} train queries{rejected} → {done['out']}",
        soft_wrap=True,
    )


app.command("eval")(eval_command)
app.command("report")(report_command)
app.command("train")(train_command)
app.command("index")(index_command)
app.command("search")(search_command)
app.command("serve")(serve_command)
app.command("judge-check")(judge_check_command)


if __name__ == "__main__":
    app()
