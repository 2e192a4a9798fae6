"""`cpr`: the command line over the stages (the jobs in jobs/ call the same functions)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cpr_ray.config import ConfigError, load_config
from cpr_ray.corpus.ingest import IngestError
from cpr_ray.pipeline import STAGES, resolve_stages, run_build
from cpr_ray.stage import read_manifest
from cpr_ray.storage import Storage, StorageError

app = typer.Typer(
    help="Cross-Pollination Retrieval on Ray: build the dataset, train and evaluate retrievers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()

# errors a user can cause and fix: one line, exit code 2, no traceback
USER_ERRORS = (ConfigError, StorageError, IngestError, ValueError)

SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key, e.g. --set ingest.num_buckets=16"),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Rerun stages even if already published.")]


def _fail(exc: Exception) -> None:
    console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


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
    set_: SetOpt = None,
) -> None:
    """Run every stage on the bundled sample, locally, and show what each did."""
    started = time.time()
    try:
        cfg = load_config("dry-run", overrides=[f"storage.root={out.resolve()}", *(set_ or [])])
        console.rule("cpr dry run: bundled sample → " + str(out))
        manifests = run_build(cfg, force=force)
    except USER_ERRORS as exc:
        _fail(exc)
    _print_manifests(manifests)
    console.print(
        f"dry run finished in {time.time() - started:.0f}s; inspect with: cpr stats {out}"
    )


@app.command()
def build(
    config: Annotated[Path | None, typer.Option("--config", help="YAML config file.")] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="Named profile to start from.")
    ] = None,
    stages: Annotated[
        str | None,
        typer.Option("--stages", help=f"Comma-separated subset of: {', '.join(STAGES)}"),
    ] = None,
    force: ForceOpt = False,
    set_: SetOpt = None,
) -> None:
    """Run the build stages (all, or --stages) with a config file and/or profile."""
    if config is None and profile is None:
        _fail(ConfigError("give --config FILE and/or --profile NAME"))
    try:
        cfg = load_config(profile, config, set_ or [])
        names = resolve_stages([s.strip() for s in stages.split(",")] if stages else None)
        manifests = run_build(cfg, names, force=force)
    except USER_ERRORS as exc:
        _fail(exc)
    _print_manifests(manifests)


@app.command()
def stats(
    root: Annotated[str, typer.Argument(help="Build root (path or s3://…).")],
    s3_endpoint: Annotated[
        str | None, typer.Option("--s3-endpoint", help="S3-compatible endpoint.")
    ] = None,
) -> None:
    """Row counts, timings and statistics of a build's published stages."""
    from cpr_ray.config import StorageConfig

    storage = Storage(StorageConfig(root=root, s3_endpoint=s3_endpoint))
    try:
        manifests = {n: m for n in STAGES if (m := read_manifest(storage, n)) is not None}
    except StorageError as exc:
        _fail(exc)
    if not manifests:
        _fail(StorageError(f"no published stage under {root}"))
    _print_manifests(manifests)
    for name, m in manifests.items():
        console.print(f"[bold]{name}[/] stats:", m.get("stats", {}))


if __name__ == "__main__":
    app()
