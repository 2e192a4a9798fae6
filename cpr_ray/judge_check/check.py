"""Run each judge on its gold cases and measure it (`cpr judge-check`).

The judges are the build's own task classes (`AnalogyJudge`, `TransferVerifier`,
`UsefulnessGrader`, `NegativeGrader`): their prompts, answer contracts, re-asks and decision rules
(`derive`) are exactly what a build runs. What is left out is what a build adds around them: no
Ray (the cases are few; asyncio keeps `llm.max_in_flight` requests in flight in this process), no
cache (a cached answer would measure an earlier model or prompt), no ledger (nothing is built),
and no pins: `llm.stages.STAGE.pin` forces a placeholder's answer, so measuring a pinned judge
would measure the pin.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from rich.table import Table

from cpr_ray.config import Config, LLMConfig
from cpr_ray.errors import UserError
from cpr_ray.judge_check.gold import EXCLUSIONS, JUDGE_STAGES, LABELS, GoldCase, load_gold, select
from cpr_ray.judge_check.metrics import agreement, at_least, cohen_kappa, confusion
from cpr_ray.judge_check.projection import (
    HOURS_FORMULA,
    SCALE_ROWS,
    SCALE_SOURCE,
    Measured,
    project,
    rows_from_root,
)
from cpr_ray.llm.client import LLMClient, Usage, probe_endpoint
from cpr_ray.llm.task import LLMTask
from cpr_ray.stage import console
from cpr_ray.storage import Storage

USEFULNESS_STAGES = ("score-positives", "judge-negatives")
KEEP_AT = 2  # the graders' κ in the method is binarised at a usefulness of 2


@dataclass(frozen=True)
class CaseResult:
    """One gold case as the judge answered it."""

    id: str
    covers: str
    expected: Any
    got: Any  # the judged label; None when the answer was invalid or failed
    status: str
    error: str | None
    calls: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    expected_exclusion: str | None = None
    exclusions: list[str] | None = None  # what the analogy judge named, where it names any


def make_task(stage: str, llm: LLMConfig) -> LLMTask:
    """The build's own task for a judged stage."""
    from cpr_ray.dataset.negatives import NegativeGrader
    from cpr_ray.queries.judges import AnalogyJudge, TransferVerifier
    from cpr_ray.queries.usefulness import UsefulnessGrader

    if stage == "judge-analogy":
        return AnalogyJudge(hold_out_flagged=llm.hold_out_flagged_inputs)
    if stage == "judge-transfer":
        return TransferVerifier()
    if stage == "score-positives":
        return UsefulnessGrader()
    if stage == "judge-negatives":
        return NegativeGrader()
    raise ValueError(f"not a judged stage: {stage}")


async def _ask_all(
    task: LLMTask, llm: LLMConfig, base_url: str, rows: list[dict[str, Any]], ids: list[str]
) -> list[tuple[dict[str, Any], str, str | None, Usage, float]]:
    """Every row through `task.run`, `llm.max_in_flight` at a time, as a build's actor asks them
    (a refusal by the endpoint stops everything; any other surprise fails only its row)."""
    client = LLMClient(llm, base_url=base_url)
    sem = asyncio.Semaphore(llm.max_in_flight)
    done = 0

    async def one(row: dict[str, Any], case_id: str):
        nonlocal done
        async with sem:
            usage = Usage()
            started = time.perf_counter()
            try:
                out, status, error = await task.run(client, row, usage)
            except UserError:
                raise
            except Exception as exc:  # a bug or surprise in one row must not stop the check
                out, status, error = task.empty_output(), "failed", f"{type(exc).__name__}: {exc}"
            seconds = time.perf_counter() - started
            done += 1
            console.print(
                f"  {task.stage}: {done}/{len(rows)} {case_id}: {status} ({seconds:.1f} s)",
                highlight=False,
            )
            return out, status, error, usage, seconds

    tasks = [asyncio.ensure_future(one(r, i)) for r, i in zip(rows, ids, strict=True)]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
    finally:
        await client.aclose()


def _answer_table(
    task: LLMTask, cases: Sequence[GoldCase], answers: Sequence[tuple[Any, ...]]
) -> pa.Table:
    """The gold inputs with the answers, as the build's tables hold them, run through the task's
    `derive`: decisions come from the same pure rules a build applies."""
    table = pa.Table.from_pylist([c.input for c in cases])
    outputs = pa.Table.from_pylist([a[0] for a in answers], schema=task.output_schema)
    for field in task.output_schema:
        table = table.append_column(field, outputs[field.name])
    table = table.append_column("status", pa.array([a[1] for a in answers], pa.string()))
    table = table.append_column("error", pa.array([a[2] for a in answers], pa.string()))
    return task.derive(table)


def judged_labels(stage: str, table: pa.Table) -> list[Any]:
    """The label each derived row reached (None where the answer is not usable)."""
    rows = table.to_pylist()
    labels: list[Any] = []
    for row in rows:
        label = None
        if row["status"] == "ok":
            if stage == "judge-analogy":
                label = row.get("decision")
            elif stage == "judge-transfer":
                label = "transfer" if row.get("verdict") == "transfer" else row.get("reject_reason")
            else:
                label = row.get("usefulness")
        labels.append(label if label in LABELS[stage] else None)
    return labels


def run_stage(
    stage: str, cases: Sequence[GoldCase], llm: LLMConfig, base_url: str
) -> list[CaseResult]:
    """Ask the stage's judge every case; one result per case, in order."""
    task = make_task(stage, llm)
    model = llm.for_stage(stage)[0]
    console.print(f"{stage}: {len(cases)} gold case(s) → {model} at {base_url}", highlight=False)
    probe_endpoint(llm, base_url)  # a dead endpoint or a refused key: one line, not N failures
    answers = asyncio.run(
        _ask_all(task, llm, base_url, [dict(c.input) for c in cases], [c.id for c in cases])
    )
    table = _answer_table(task, cases, answers)
    labels = judged_labels(stage, table)
    named = table["exclusions"].to_pylist() if "exclusions" in table.column_names else None
    return [
        CaseResult(
            id=case.id,
            covers=case.covers,
            expected=case.label,
            got=label,
            status=status,
            error=error,
            calls=usage.calls,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            seconds=round(seconds, 3),
            expected_exclusion=case.exclusion,
            exclusions=None if named is None else (named[i] or []),
        )
        for i, (case, label, (_, status, error, usage, seconds)) in enumerate(
            zip(cases, labels, answers, strict=True)
        )
    ]


def measure(stage: str, results: Sequence[CaseResult]) -> dict[str, Any]:
    """Agreement, κ, invalid rate and per-answer means of one stage's results."""
    gold = [r.expected for r in results]
    got = [r.got for r in results]
    n = len(results)
    statuses = Counter(r.status for r in results)
    unusable = sum(g is None for g in got)
    out: dict[str, Any] = {
        "cases": n,
        "ok": statuses.get("ok", 0),
        "invalid": statuses.get("invalid", 0),
        "failed": statuses.get("failed", 0),
        "invalid_rate": round(unusable / n, 4),
        "agreement": round(agreement(gold, got), 4),
        "kappa": round(cohen_kappa(gold, got), 4),
        "mean": asdict(
            Measured(
                calls=sum(r.calls for r in results) / n,
                prompt_tokens=sum(r.prompt_tokens for r in results) / n,
                completion_tokens=sum(r.completion_tokens for r in results) / n,
                seconds=sum(r.seconds for r in results) / n,
            )
        ),
        "labels": {
            "gold": {str(k): v for k, v in sorted(Counter(gold).items(), key=str)},
            "judged": {str(k): v for k, v in sorted(Counter(got).items(), key=str)},
        },
        "confusion": confusion(gold, got),
    }
    if stage in USEFULNESS_STAGES:
        gold_bin, got_bin = at_least(gold, KEEP_AT), at_least(got, KEEP_AT)
        out["agreement_at_2"] = round(agreement(gold_bin, got_bin), 4)
        out["kappa_at_2"] = round(cohen_kappa(gold_bin, got_bin), 4)
    if stage == "judge-analogy":
        excluded = [r for r in results if r.expected_exclusion in EXCLUSIONS]
        if excluded and all(r.exclusions is not None for r in results):
            # "alone" too: a judge that ticks every exclusion names the right one every time
            out["exclusions_named"] = {
                "named": sum(r.expected_exclusion in (r.exclusions or []) for r in excluded),
                "alone": sum(r.exclusions == [r.expected_exclusion] for r in excluded),
                "cases": len(excluded),
            }
        else:
            out["exclusions_named"] = None  # this judge's answer names no exclusions
    return out


def without_pins(llm: LLMConfig) -> LLMConfig:
    """`llm` with every stage's pins dropped: a pinned judge's agreement would measure the pin."""
    stages = {k: v.model_copy(update={"pin": {}}) for k, v in llm.stages.items()}
    return llm.model_copy(update={"stages": stages})


def check_judges(
    cfg: Config,
    stages: Sequence[str] = JUDGE_STAGES,
    *,
    limit: int | None = None,
    root: str | None = None,
    pins_ignored: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Measure each stage's judge on its gold cases and project a full build; the report as a
    dict (what `--out` writes). Starts the embedded local judge when no endpoint is configured.
    `pins_ignored`: the stages whose pins were dropped as the config loaded (the config's own
    pins, which are dropped here, are added to them)."""
    from cpr_ray.llm.local_server import local_server

    cases = {s: select(load_gold(s), limit) for s in stages}  # a bad gold file stops first
    if root:
        rows, source = rows_from_root(Storage(cfg.storage.model_copy(update={"root": root})))
    else:
        rows, source = dict(SCALE_ROWS), SCALE_SOURCE
    pinned = sorted({*(pins_ignored or ()), *(s for s, o in cfg.llm.stages.items() if o.pin)})
    llm = without_pins(cfg.llm)
    embedded = not llm.base_url
    results: dict[str, list[CaseResult]] = {}
    if embedded:
        with local_server() as url:
            llm = llm.model_copy(update={"base_url": url})
            for stage in stages:
                results[stage] = run_stage(stage, cases[stage], llm, url)
    else:
        for stage in stages:
            results[stage] = run_stage(stage, cases[stage], llm, llm.base_url)
    report_stages = []
    for stage in stages:
        measured = measure(stage, results[stage])
        report_stages.append(
            {
                "stage": stage,
                "model": llm.for_stage(stage)[0],
                **measured,
                "projection": project(stage, rows[stage], Measured(**measured["mean"]), llm),
                "results": [asdict(r) for r in results[stage]],
            }
        )
    return {
        "endpoint": llm.base_url,
        "embedded_server": embedded,
        "same_verifier": llm.same_verifier() and "judge-transfer" in stages,
        "pins_ignored": pinned,
        "limit": limit,
        "rows_source": source,
        "hours_formula": HOURS_FORMULA,
        "stages": report_stages,
    }


def below(report: dict[str, Any], min_kappa: float) -> list[str]:
    """'STAGE κ K' for every stage whose κ is under `min_kappa`."""
    return [f"{s['stage']} κ {s['kappa']:.2f}" for s in report["stages"] if s["kappa"] < min_kappa]


def _num(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def _tokens(value: int) -> str:
    return f"{value / 1e6:,.1f}M" if value >= 1e5 else f"{value:,}"


def header_lines(report: dict[str, Any]) -> list[str]:
    """What the numbers measure: the endpoint, and that pins were ignored."""
    lines = [f"judge-check: the build's judges on the shipped gold set, at {report['endpoint']}"]
    if report["embedded_server"]:
        lines.append(
            "[bold yellow]note:[/] no llm.base_url: the embedded placeholder (Gemma 3 270M base "
            "model) answers; it follows no instruction, so expect κ near 0 (chance). Give "
            "--llm-base-url URL --llm-model M to measure a real judge."
        )
    if report["pins_ignored"]:
        lines.append(
            "[bold yellow]note:[/] this profile pins answers of "
            f"{', '.join(report['pins_ignored'])} "
            "(llm.stages.*.pin); judge-check ignores pins: a pinned judge would only measure "
            "the pin."
        )
    if report["same_verifier"] and not report["embedded_server"]:
        lines.append(
            "[bold yellow]note:[/] judge-transfer asks the analogy judge's own model; the method "
            "verifies with a second model (llm.stages.judge-transfer.model), and a build refuses "
            "one model for both unless llm.allow_same_verifier is true."
        )
    if report["limit"]:
        lines.append(f"at most {report['limit']} case(s) per stage (--limit), spread over labels")
    return lines


def report_table(report: dict[str, Any]) -> Table:
    """One row per stage: how well the judge agrees, and what a full build would cost."""
    table = Table(title="judge check", title_justify="left")
    columns = (
        "stage",
        "model",
        "cases",
        "agreement",
        "κ",
        "invalid",
        "prompt tok/ans",
        "compl. tok/ans",
        "s/ans",
        "full-build rows",
        "calls",
        "tokens in/out",
        "USD",
        "hours",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("stage", "model") else "right")
    for s in report["stages"]:
        p, m = s["projection"], s["mean"]
        table.add_row(
            s["stage"],
            s["model"],
            str(s["cases"]),
            f"{s['agreement']:.2f}",
            f"{s['kappa']:.2f}",
            f"{s['invalid_rate']:.0%}",
            _num(m["prompt_tokens"]),
            _num(m["completion_tokens"]),
            _num(m["seconds"], 1),
            _num(p["rows"]),
            _num(p["calls"]),
            f"{_tokens(p['prompt_tokens'])}/{_tokens(p['completion_tokens'])}",
            _num(p["usd"], 2),
            _num(p["hours"], 2),
        )
    return table


def footer_lines(report: dict[str, Any]) -> list[str]:
    """The binarised κ of the graders, the exclusions named, and how the projection is made."""
    lines = []
    for s in report["stages"]:
        if "kappa_at_2" in s:
            lines.append(
                f"{s['stage']}: binarised at 2 (kept ≥ 2, the method's κ), agreement "
                f"{s['agreement_at_2']:.2f}, κ {s['kappa_at_2']:.2f}"
            )
        named = s.get("exclusions_named")
        if named:
            lines.append(
                f"{s['stage']}: {named['named']} of {named['cases']} exclusion case(s) named the "
                f"gold's exclusion, {named['alone']} named it alone"
            )
    no_price = sorted(
        {s["projection"]["model"] for s in report["stages"] if s["projection"]["usd"] is None}
    )
    if no_price:
        lines.append(f"USD n/a: no llm.prices entry for {', '.join(no_price)}")
    lines.append(f"rows: {report['rows_source']}; calls and tokens = rows × the means per answer")
    lines.append(report["hours_formula"])
    lines.append("κ counts an invalid or failed answer as a disagreement (see `invalid`)")
    return lines


def print_report(report: dict[str, Any]) -> None:
    for line in header_lines(report):
        console.print(line, soft_wrap=True)
    console.print(report_table(report))
    for line in footer_lines(report):
        console.print(line, soft_wrap=True, highlight=False)
