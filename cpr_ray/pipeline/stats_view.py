"""What `cpr stats ROOT` shows of a build: one screen by default, every figure on request.

A stage's manifest keeps all its statistics (per-field counts, per-pooler settings, the Q-D
metrics, ...); printed whole for every stage they filled 683 lines of an 80-column terminal
after a dry run, most of them dict dumps (51 lines now). The screen shows one row per stage and
one line of each stage's plain figures;
`cpr stats ROOT --stage NAME` prints one stage's whole manifest and `--json` everything, as JSON
a script or `jq` reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from rich import box
from rich.table import Table

from cpr_ray.runs.failures import Failure

# a string figure longer than this (a URI, a fingerprint list) is left to --stage
_SHORT = 40


def stages_table(manifests: Mapping[str, Mapping[str, Any]]) -> Table:
    """One row per published stage: its run, seconds and the rows of each table it published
    (where they went is in `--stage NAME`)."""
    table = Table(title="stages", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("stage", "run", "seconds", "tables (rows)"):
        table.add_column(col, justify="right" if col == "seconds" else "left")
    for name, m in manifests.items():
        tables = ", ".join(f"{t} {spec['rows']:,}" for t, spec in m.get("tables", {}).items())
        seconds = m.get("seconds")
        shown = f"{seconds:,.1f}" if isinstance(seconds, (int, float)) else ""
        table.add_row(name, str(m.get("run_id", "")), shown, tables)
    return table


def _figure(value: Any) -> str | None:
    """A plain figure as the summary line shows it; None for what only --stage shows."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str) and value and len(value) <= _SHORT:
        return value
    return None


def summary_line(name: str, manifest: Mapping[str, Any], width: int) -> str:
    """`name: key figure, key figure, …` over the stage's plain top-level statistics, cut to
    `width` characters, saying how many more values `--stage NAME` holds."""
    stats = manifest.get("stats") or {}
    shown = [(k, f) for k, v in stats.items() if (f := _figure(v)) is not None]
    hidden = len(stats) - len(shown)
    head = f"{name}: "
    body = ", ".join(f"{k} {f}" for k, f in shown) or "no plain figures"
    tail = f" (+{hidden} more: --stage {name})" if hidden else ""
    room = max(width - len(head) - len(tail), 10)
    if len(body) > room:
        body = body[: room - 1].rstrip(", ") + "…"
    return head + body + tail


def full_stats(
    manifests: Mapping[str, Mapping[str, Any]],
    ledger: Sequence[Mapping[str, Any]],
    failures: Sequence[Failure],
) -> dict[str, Any]:
    """Everything `cpr stats` knows of a root, as one JSON-ready value (`--json`)."""
    return {
        "stages": dict(manifests),
        "llm_ledger": list(ledger),
        "last_failures": [asdict(f) for f in failures],
    }
