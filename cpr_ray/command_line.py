"""What every command shares: the options that reach the one config tree, and the one-line error.

`cpr` subcommands (typer) and the `jobs/*.py` entry points (argparse, for `ray job submit`) take
the same `--config`, `--profile` and `--set` and end a user's mistake the same way: one line,
exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from cpr_ray.errors import UserError

console = Console()

ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config", help="YAML config file (any section of the config tree): a path or s3://…"
    ),
]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="Named profile to start from.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key, e.g. --set ingest.num_buckets=16"),
]
S3EndpointOpt = Annotated[str | None, typer.Option("--s3-endpoint", help="S3-compatible endpoint.")]
LLMUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--llm-base-url",
        help="OpenAI-compatible endpoint for the LLM steps (key from $OPENAI_API_KEY, or the "
        "variable named by llm.api_key_env).",
    ),
]
LLMModelOpt = Annotated[str | None, typer.Option("--llm-model", help="Model name at the endpoint.")]


def fail(exc: Exception) -> NoReturn:
    """A user's mistake: its one line (however long), exit code 2."""
    console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
    raise typer.Exit(2)


def job_parser(
    doc: str, flags: Mapping[str, str], example: str, int_flags: frozenset[str] = frozenset()
) -> argparse.ArgumentParser:
    """A job's parser: --config, --profile, one option per flag (named for the key it sets) and
    --set, in the precedence of `load_config`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--config", help="YAML config (any section of the tree): path or s3://…")
    parser.add_argument("--profile", help="named profile to start from")
    for flag, key in flags.items():
        parser.add_argument(
            "--" + flag.replace("_", "-"),
            dest=flag,
            type=int if flag in int_flags else str,
            help=f"sets {key}",
        )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override any config key, e.g. {example}",
    )
    return parser


def run_job(work: Callable[[], Iterable[str]]) -> int:
    """A job's body: its summary lines on success (exit 0), or a user's mistake as the CLI's one
    `error:` line on stderr (exit 2) so `ray job logs` shows it without a traceback."""
    try:
        lines = list(work())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
