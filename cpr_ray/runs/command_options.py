"""What every command shares: the options that reach the one config tree, and the one-line error.

`cpr` subcommands (typer) and the `jobs/*.py` entry points (argparse, for `ray job submit`) take
the same `--config`, `--profile` and `--set` and end a user's mistake the same way: one line on
stderr, exit code 2, no traceback. A bug ends both the same way too: its traceback (secrets
redacted), then one last line with its cause and where the stage's failure record went (exit
1), so the job log's last line says why. A command's own flags are one table of `Flag`s (the
config key each sets); the typer options and the job's argparse options are both made from it,
typed and described by the config field behind the key, so a flag is declared once.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, Union, get_args, get_origin

import typer
from rich.console import Console
from rich.markup import escape

from cpr_ray.errors import UserError

if TYPE_CHECKING:
    from cpr_ray.config import Config

console = Console()
errors = Console(stderr=True)

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
    """A user's mistake: its one line (however long) on stderr, exit code 2 (or the error's
    own: 75 for a refresh that found the root owned, `leases.RootOwned`)."""
    errors.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
    raise typer.Exit(getattr(exc, "exit_code", 2))


def crash_line(exc: BaseException) -> str:
    """The last line a bug leaves: its cause, and the failure record with the traceback."""
    from cpr_ray.runs import failures  # imports Ray: not for --help

    record = failures.of(exc)
    if record is not None:
        return (
            f"error: {record.stage} failed: {record.cause} (a bug, not your input; traceback in "
            f"{record.log})"
        )
    cause = failures.redact(failures.cause_of(exc)[1], failures.secret_names())
    return f"error: {cause} (a bug, not your input; traceback above)"


def report_crash(exc: BaseException) -> int:
    """A bug's traceback (secrets redacted), then its one line on stderr; the exit code, 1."""
    from cpr_ray.runs import failures

    sys.stderr.write(failures.traceback_text(exc, failures.secret_names()))
    print(crash_line(exc), file=sys.stderr, flush=True)
    return 1


@dataclass(frozen=True)
class Flag:
    """A command's option that sets one config key (flags win over --set, env and YAML)."""

    key: str  # e.g. "eval.top_k"
    name: str | None = None  # the option's name where it is not the key's last part
    help: str | None = None  # where the config field's description is not what a user needs

    @property
    def dest(self) -> str:
        return self.name or self.key.rsplit(".", 1)[1]

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")


def _field(key: str) -> Any:
    from cpr_ray.config import Config  # the command line builds on the config, not the reverse

    model: Any = Config
    *sections, name = key.split(".")
    for section in sections:
        model = _plain(model.model_fields[section].annotation)
    return model.model_fields[name]


def _plain(annotation: Any) -> Any:
    """`X | None` → X."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def flag_type(flag: Flag) -> type:
    """The Python type an option parses into: the field's (a Literal is a string)."""
    annotation = _plain(_field(flag.key).annotation)
    if get_origin(annotation) is Literal:
        return str
    return annotation if annotation in (int, float, bool, str) else str


def flag_help(flag: Flag) -> str:
    field = _field(flag.key)
    text = flag.help or (field.description or "").rstrip(".")
    annotation = _plain(field.annotation)
    if get_origin(annotation) is Literal and flag.help is None:
        text += f" ({' | '.join(str(a) for a in get_args(annotation))})"
    return f"{text} [{flag.key}]"


@dataclass(frozen=True)
class Given:
    """What a command was given that reaches the config tree: `--config`, `--profile`, `--set`
    and its own flags ({config key: value}; None is a flag not given). `cpr X` (`with_flags`) and
    `jobs/X.py` (`job_parser`) both hand their command one of these."""

    config: str | None
    profile: str | None
    overrides: tuple[str, ...]
    flags: Mapping[str, Any]

    def load(
        self,
        *,
        required: Sequence[str] = (),
        check: Callable[[Config], None] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Config:
        """The one config tree the command runs on: profile < YAML < CPR_* env < --set < its
        flags (and `extra`: keys a command sets from its arguments). Then the keys it cannot
        run without and its own checks, so that `cpr X` and `jobs/X.py` refuse the same
        mistakes before any work."""
        from cpr_ray.config import load_config

        flags = {**self.flags, **(extra or {})}
        cfg = load_config(self.profile, self.config, list(self.overrides), flags=flags)
        cfg.require(*required)
        if check is not None:
            check(cfg)
        return cfg


def job_given(args: argparse.Namespace, table: Sequence[Flag]) -> Given:
    """A job's parsed arguments (`job_parser`) as its command's `Given`."""
    return Given(args.config, args.profile, tuple(args.overrides), flag_values(table, vars(args)))


def flag_values(table: Sequence[Flag], given: Mapping[str, Any]) -> dict[str, Any]:
    """{config key: value} of the flags in `given` (by option name); None means not given."""
    return {f.key: given.get(f.dest) for f in table}


def with_flags(table: Sequence[Flag]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a typer command one option per flag of `table`, then `--config`, `--profile` and
    `--set`; the command receives them as `given` (a `Given`) beside its own parameters."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "given"
        ]
        added = []
        for f in table:
            kind = flag_type(f)
            decl = f"{f.option}/--no-{f.option[2:]}" if kind is bool else f.option
            text = escape(flag_help(f))  # typer renders rich markup: "[eval.top_k]" is text
            # a type made at run time, for typer to read: not a static annotation
            annotation = Annotated[kind | None, typer.Option(decl, help=text)]  # type: ignore[valid-type]
            added.append(
                inspect.Parameter(
                    f.dest, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
                )
            )
        common = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=opt)
            for name, opt in (("config", ConfigOpt), ("profile", ProfileOpt), ("set_", SetOpt))
        ]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in [*added, *own]]
        params += common

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            flags = flag_values(table, {f.dest: kwargs.pop(f.dest) for f in table})
            overrides = tuple(kwargs.pop("set_") or ())
            given = Given(kwargs.pop("config"), kwargs.pop("profile"), overrides, flags)
            return fn(given=given, **kwargs)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer reads the signature above, not fn's
        return command

    return decorate


def job_parser(doc: str, table: Sequence[Flag], example: str) -> argparse.ArgumentParser:
    """A job's parser: --config, --profile, one option per flag of the command's table (typed
    and described by its config field) and --set, in the precedence of `load_config`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--config", help="YAML config (any section of the tree): path or s3://…")
    parser.add_argument("--profile", help="named profile to start from")
    for f in table:
        kind = flag_type(f)
        if kind is bool:
            parser.add_argument(
                f.option, dest=f.dest, action=argparse.BooleanOptionalAction, help=flag_help(f)
            )
        else:
            parser.add_argument(f.option, dest=f.dest, type=kind, help=flag_help(f))
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
    """A job's body: its summary lines on success (exit 0; none from a job that printed its own),
    or a user's mistake as the CLI's one `error:` line on stderr (exit 2) so `ray job logs` shows
    it without a traceback; a bug as `report_crash` tells it (exit 1), its cause the log's last
    line."""
    try:
        lines = list(work())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        return report_crash(exc)
    if lines:
        print("\n".join(lines))
    return 0
