"""`cpr judge-check`: the command (parse, call `check_judges`, print, gate on κ and precision;
or, with `--gold-report`, describe the gold set without asking any endpoint)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cpr_ray.config import Config, load_config, stage_name
from cpr_ray.errors import ConfigError, UserError
from cpr_ray.judge_check.check import below, below_precision, check_judges
from cpr_ray.judge_check.gate_report import report_lines
from cpr_ray.judge_check.gold import JUDGE_STAGES, gold_path, load_gold
from cpr_ray.judge_check.gold_report import gold_lines, gold_summary
from cpr_ray.judge_check.projection import store_report
from cpr_ray.runs.command_options import (
    ConfigOpt,
    LLMModelOpt,
    LLMUrlOpt,
    ProfileOpt,
    SetOpt,
    console,
    fail,
)


def judge_config(
    config: str | None, profile: str | None, overrides: list[str]
) -> tuple[Config, list[str]]:
    """The settings to measure with, and the stages whose pins were dropped to load them.

    Pins beside an endpoint are a config error everywhere else; judge-check measures the
    model, never a pin, so it drops them as the dry run does (`unpin_for_endpoint`) and says
    which it dropped. Without --config or --profile: the defaults when an endpoint is given
    (flag, --set or CPR_LLM__BASE_URL), otherwise the dry-run profile, whose LLM settings
    (slots, timeouts, token limits) are sized for the embedded judge."""
    if config is None and profile is None:
        cfg = load_config(overrides=overrides)
        if cfg.llm.base_url:
            return cfg, []
        profile = "dry-run"
    # the pins the settings hold, read with no endpoint (where pins are allowed)
    bare = load_config(profile, config, [*overrides, "llm.base_url=null"])
    pinned: list[str] = sorted(s for s, o in bare.llm.stages.items() if o.pin)
    return load_config(profile, config, overrides, unpin_for_endpoint=True), pinned


def parse_stages(stages: str | None) -> list[str]:
    """The judged stages asked for, in either spelling (judge_analogy = judge-analogy)."""
    if not stages:
        return list(JUDGE_STAGES)
    names = [stage_name(s.strip()) for s in stages.split(",") if s.strip()]
    unknown = [s for s in names if s not in JUDGE_STAGES]
    if unknown or not names:
        raise ConfigError(
            f"--stages: {', '.join(unknown) or '(none)'} not judged; choose from "
            f"{', '.join(JUDGE_STAGES)}"
        )
    return list(dict.fromkeys(names))


def judge_check_command(
    config: ConfigOpt = None,
    profile: ProfileOpt = None,
    stages: Annotated[
        str | None,
        typer.Option("--stages", help=f"Comma-separated subset of: {', '.join(JUDGE_STAGES)}"),
    ] = None,
    root: Annotated[
        str | None,
        typer.Option(
            "--root",
            help="A build (path or s3://…) whose mined pairs and published stages size the "
            "projection and give each judge's base rate (its pass share, corrected with the "
            "gold's sensitivity and specificity); default: the method at full scale "
            "(benchmarks/SCALE.md) and the assumed base rates.",
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="At most N gold cases per stage, spread over labels."),
    ] = None,
    min_kappa: Annotated[
        float | None,
        typer.Option(
            "--min-kappa",
            help="Exit 2 when any stage's binarised κ (strongest: κ over the index) has the lower "
            "bound of its 95% interval below this. Refused with --limit or a gold with under 10 "
            "cases on either side of a stage's binary.",
        ),
    ] = None,
    min_precision: Annotated[
        float | None,
        typer.Option(
            "--min-precision",
            min=0.0,
            max=1.0,
            help="Exit 2 when any judge's precision at its base rate (the share of the rows it "
            "passes in a build that deserve to pass) has the lower bound of its interval below "
            "this.",
        ),
    ] = None,
    gold: Annotated[
        Path | None,
        typer.Option(
            "--gold", help="A folder of STAGE.jsonl gold files instead of the shipped set."
        ),
    ] = None,
    gold_report: Annotated[
        bool,
        typer.Option(
            "--gold-report",
            help="Only describe the gold set (cases, real and synthetic, classes, the two "
            "readers' agreement); asks no endpoint.",
        ),
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the report as JSON to this file.")
    ] = None,
    llm_base_url: LLMUrlOpt = None,
    llm_model: LLMModelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Measure each LLM judge on the gold set (binarised κ with its interval, precision at the
    corpus's base rate, agreement over every label, invalid answers, tokens and seconds per
    answer) and project a full build's calls, tokens, USD and hours. Run it before the first
    cluster build."""
    overrides = [f"llm.base_url={llm_base_url}"] if llm_base_url else []
    overrides += [f"llm.model={llm_model}"] if llm_model else []
    try:
        names = parse_stages(stages)
        if gold_report:
            print_gold_report(names, gold)
            return
        cfg, pinned = judge_config(config, profile, [*overrides, *(set_ or [])])
        gated = min_kappa is not None or min_precision is not None
        report = check_judges(
            cfg, names, limit=limit, root=root, pins_ignored=pinned, gold=gold, gated=gated
        )
    except UserError as exc:
        fail(exc)
    for line in report_lines(report):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        console.print(f"report written to {out}", soft_wrap=True)
    if root is not None:  # what `cpr stats ROOT --watch` sets the build's spend against
        stored = store_report(cfg, root, report)
        console.print(f"report stored with the build → {stored}", soft_wrap=True)
    failing = below(report, min_kappa) if min_kappa is not None else []
    if min_precision is not None:
        failing += below_precision(report, min_precision)
    if failing:
        bars = [f"--min-kappa {min_kappa}" if min_kappa is not None else None]
        bars.append(f"--min-precision {min_precision}" if min_precision is not None else None)
        fail(
            UserError(f"judge-check: {'; '.join(failing)} below {', '.join(b for b in bars if b)}")
        )


def print_gold_report(stages: list[str], folder: Path | None) -> None:
    """Each stage's gold set: counts, classes, the κ step of one miss, the readers' agreement."""
    for stage in stages:
        path = gold_path(stage, folder)
        cases = load_gold(stage, path)
        console.print(f"{stage}: {path}", soft_wrap=True, highlight=False, markup=False)
        for line in gold_lines(stage, gold_summary(stage, cases)):
            console.print(line, soft_wrap=True, highlight=False, markup=False)
