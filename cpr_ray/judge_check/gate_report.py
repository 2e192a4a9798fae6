"""The judge-check report as lines a person reads: one block per stage, then the projection.

Every line fits 80 columns (a terminal's default and a CI log's), so no figure is cut to a
stub: a table of fourteen columns was unreadable there. Figures are printed in full; only the
notes are wrapped, at word boundaries. `--out` keeps the whole report as JSON.
"""

from __future__ import annotations

import textwrap
from typing import Any

from cpr_ray.judge_check.gold_report import gold_lines
from cpr_ray.judge_check.projection import LEDGER_SOURCE

WIDTH = 80
INDENT = " " * 14  # the continuation of a labelled line (two spaces, a 12-character label)


def wrap(text: str, indent: str = "") -> list[str]:
    """A note in lines of at most WIDTH characters."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent or "  ")


def _num(value: float | int | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _tokens(value: int) -> str:
    return f"{value / 1e6:,.1f}M" if value >= 1e5 else f"{value:,}"


def _ci(ci: list[float] | None, digits: int = 2) -> str:
    return "" if ci is None else f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def header_lines(report: dict[str, Any]) -> list[str]:
    """What the numbers measure: the endpoint, and that pins were ignored."""
    lines = wrap(f"judge-check: the build's judges on the gold set, at {report['endpoint']}")
    if report["embedded_server"]:
        lines += wrap(
            "note: no llm.base_url: the embedded placeholder (Gemma 3 270M base model) "
            "answers; it follows no instruction, so expect κ near 0 (chance). Give "
            "--llm-base-url URL --llm-model M to measure a real judge."
        )
    if report["pins_ignored"]:
        lines += wrap(
            f"note: this profile pins answers of {', '.join(report['pins_ignored'])} "
            "(llm.stages.*.pin); judge-check ignores pins: a pinned judge would only measure "
            "the pin."
        )
    if report["same_verifier"] and not report["embedded_server"]:
        lines += wrap(
            "note: judge-transfer asks the analogy judge's own model; the method verifies with "
            "a second model (llm.stages.judge-transfer.model), and a build refuses one model "
            "for both unless llm.allow_same_verifier is true."
        )
    if report["limit"]:
        lines.append(f"at most {report['limit']} case(s) per stage (--limit), spread over labels")
    return lines


def stage_lines(s: dict[str, Any]) -> list[str]:
    """One stage's block: the gated κ first, then what a build's rows would hold."""
    lines = [f"{s['stage']}: {s['cases']} cases, model {s['model']}"]
    b = s["binary"]
    if b is None:  # strongest: the label is an index
        lines.append(
            f"  index       κ {s['kappa']:.2f}{_ci(s['kappa_ci'])}, accuracy "
            f"{s['agreement']:.2f} (gated: lower bound)"
        )
    else:
        lines.append(
            f"  pass/not    κ {b['kappa']:.2f}{_ci(b['kappa_ci'])}, agreement "
            f"{b['agreement']:.2f} (gated: lower bound)"
        )
        n_labels = len(s["labels"]["gold"])
        lines.append(
            f"  labels      κ {s['kappa_labels']:.2f}, agreement {s['agreement']:.2f} "
            f"({n_labels} labels)"
        )
        lines += _precision_lines(s["stage"], b, s["base_rate_source"])
        lines += _observed_lines(s.get("observed_on_not_taken"))
    lines.append(
        f"  invalid     {s['invalid_rate']:.0%} ({s['invalid']} invalid, {s['failed']} failed)"
    )
    named = s.get("exclusions_named")
    if named:
        lines.append(
            f"  exclusions  {named['named']} of {named['cases']} named the gold's, "
            f"{named['alone']} alone"
        )
    fails = s.get("fails_named")
    if fails:
        lines.append(f"  fails       {fails['same']} of {fails['cases']} rejects name the gold's")
    m = s["mean"]
    lines.append(
        f"  per answer  {_num(m['prompt_tokens'])} prompt + {_num(m['completion_tokens'])} "
        f"completion tokens"
    )
    lines.append(f"              {m['calls']:.1f} calls, {m['seconds']:.1f} s")
    lines += gold_lines(s["stage"], s["gold"])
    return lines


def _precision_lines(stage: str, b: dict[str, Any], source: str | None) -> list[str]:
    sens, spec = _num(b["sensitivity"], 2), _num(b["specificity"], 2)
    lines = [f"  sens/spec   {sens}{_ci(b['sensitivity_ci'])} / {spec}{_ci(b['specificity_ci'])}"]
    if b["base_rate"] is None:
        return lines
    rate = f"{b['base_rate']:.0%}"
    rate_ci = b["base_rate_ci"]
    if rate_ci and rate_ci[0] != rate_ci[1]:
        rate += f" [{rate_ci[0]:.0%}, {rate_ci[1]:.0%}]"
    if b["false_per_100"] is None:
        lines.append(f"  precision   n/a at base rate {rate}: it passed no case")
    else:
        ci = b["false_per_100_ci"]
        interval = "" if ci is None else f" [{ci[0]:.0f}, {ci[1]:.0f}]"
        lines.append(
            f"  precision   {b['precision']:.2f}{_ci(b['precision_ci'])} (gated: lower bound)"
        )
        lines.append(f"              at base rate {rate}; of every 100 rows it passes")
        lines.append(
            f"              in a build, about {b['false_per_100']:.0f}{interval} would be false"
        )
    if b["observed_pass_share"] is not None:
        lines.append(
            f"              (the build passed {b['observed_pass_share']:.0%}; corrected: {rate})"
        )
    if source:
        lines += wrap(f"base rate: {source}", INDENT)
    return lines


def _observed_lines(block: dict[str, Any] | None) -> list[str]:
    """The purpose-label block: passes as observed on citations a human labelled background,
    comparison or future work (a label nobody on this project wrote)."""
    if block is None:
        return []
    lines = [
        f"  purpose     observed on background citations: {block['passed']} of {block['citations']}"
    ]
    lines += wrap(
        f"(citations labelled BACKGROUND, COMPARES_CONTRASTS or FUTURE by the citation set; the "
        f"gold passes {block['gold_passed']} of them)",
        INDENT,
    )
    return lines


PROJECTION_HEADER = (
    f"{'stage':<19}{'rows':>9}{'calls':>9}{'tokens in/out':>16}{'USD':>13}{'hours':>9}"
)


def projection_lines(p: dict[str, Any]) -> list[str]:
    """The full build's projection: a narrow table and how it is made."""
    lines = ["full build, projected:", PROJECTION_HEADER]
    for s in p["stages"]:
        tokens = f"{_tokens(s['prompt_tokens'])}/{_tokens(s['completion_tokens'])}"
        lines.append(
            f"{s['stage']:<19}{_num(s['rows']):>9}{_num(s['calls']):>9}{tokens:>16}"
            f"{_num(s['usd'], 2):>13}{_num(s['hours'], 2):>9}"
        )
    t = p["total"]
    tokens = f"{_tokens(t['prompt_tokens'])}/{_tokens(t['completion_tokens'])}"
    lines.append(
        f"{'total':<19}{'':>9}{_num(t['calls']):>9}{tokens:>16}{_num(t['usd'], 2):>13}"
        f"{_num(t['hours_measured'], 2):>9}"
    )
    fleet = p.get("fleet")
    if fleet is not None:
        missing = fleet["stages_without_hours"]
        lines += wrap(
            f"fleet: {fleet['node_hours']:,.2f} node-hours (hours × llm.fleet.nodes "
            f"{fleet['nodes']}) at llm.fleet.node_hour_usd ${fleet['node_hour_usd']:,.2f}: "
            f"USD {fleet['usd']:,.2f}"
            + (f" (n/a for {', '.join(missing)}: hours not measured)" if missing else "")
        )
    if p["max_usd"] is not None and t["usd"] is not None:
        usd = t["usd"] + (fleet["usd"] if fleet else 0.0)
        over = "over" if usd > p["max_usd"] else "within"
        what = f"tokens {t['usd']:,.2f} + fleet {fleet['usd']:,.2f}" if fleet else ""
        lines += wrap(
            f"USD {usd:,.2f}{f' ({what})' if what else ''} is {over} the build's cap "
            f"llm.max_usd {p['max_usd']:,.2f}"
        )
    if t.get("usd_prefix_cached") is not None:
        lines += wrap(
            f"USD with a prefix cache {t['usd_prefix_cached']:,.2f}: each stage's shared prompt "
            f"prefix ({p['prefix_source']}) at llm.prices.MODEL.cached_input_per_mtok (unset: "
            "the input price, no discount)"
        )
    no_price = sorted({s["model"] for s in p["stages"] if s["usd"] is None})
    if no_price:
        lines += wrap(f"USD n/a: no llm.prices entry for {', '.join(no_price)}")
    measured = [s["stage"] for s in p["stages"] if s["means"] != LEDGER_SOURCE]
    lines += wrap(
        f"per row: measured here for {', '.join(measured) or 'no stage'}; the others from "
        "benchmarks/SCALE.md's dry-run ledger (hours n/a: no latency measured)"
    )
    lines += wrap(f"rows: {p['rows_source']}")
    rates = ", ".join(f"{s} {r['rate']:.0%}" for s, r in p["pass_rates"].items())
    lines += wrap(f"pass rates: {rates}")
    lines += wrap(f"{p['hours_formula']}; concurrency {p['concurrency']}")
    lines += wrap("κ counts an invalid or failed answer as a disagreement (see `invalid`)")
    return lines


def report_lines(report: dict[str, Any]) -> list[str]:
    lines = header_lines(report)
    for s in report["stages"]:
        lines += ["", *stage_lines(s)]
    return [*lines, "", *projection_lines(report["projection"])]
