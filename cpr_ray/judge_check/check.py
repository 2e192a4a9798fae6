"""Run each judge on its gold cases and measure it (`cpr judge-check`).

The judges are the build's own task classes (`AnalogyJudge`, `TransferVerifier`, the review
step of `QueryWriter`, `SameProblemJudge`, `StrongestAnalogyJudge`, `UsefulnessGrader`,
`NegativeGrader`; `tasks.py`): their prompts, answer contracts, re-asks and decision rules
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
from pathlib import Path
from typing import Any

import pyarrow as pa

from cpr_ray.config import Config, LLMConfig
from cpr_ray.errors import UserError
from cpr_ray.judge_check.gold import (
    EXCLUSIONS,
    JUDGE_STAGES,
    LABELS,
    GoldCase,
    build_stage,
    gold_path,
    kept,
    load_gold,
    select,
)
from cpr_ray.judge_check.gold_report import gold_summary
from cpr_ray.judge_check.metrics import agreement, binary_report, bootstrap, cohen_kappa, confusion
from cpr_ray.judge_check.projection import Measured, project_build, volumes, volumes_from_root
from cpr_ray.judge_check.tasks import judged_label, make_task
from cpr_ray.llm.client import LLMClient, Usage, probe_endpoint
from cpr_ray.llm.task import LLMTask
from cpr_ray.stage import console
from cpr_ray.storage import Storage


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
    expected_fails: list[str] | None = None  # write-queries: the review booleans the gold fails
    fails: list[str] | None = None  # and those the reviewer answered false


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
    labels = [judged_label(stage, row) for row in table.to_pylist()]
    return [label if label in LABELS[stage] else None for label in labels]


def run_stage(
    stage: str, cases: Sequence[GoldCase], llm: LLMConfig, base_url: str
) -> list[CaseResult]:
    """Ask the stage's judge every case; one result per case, in order."""
    task = make_task(stage, llm.hold_out_flagged_inputs)
    model = llm.for_stage(task.stage)[0]
    console.print(f"{stage}: {len(cases)} gold case(s) → {model} at {base_url}", highlight=False)
    probe_endpoint(llm, base_url)  # a dead endpoint or a refused key: one line, not N failures
    answers = asyncio.run(
        _ask_all(task, llm, base_url, [dict(c.input) for c in cases], [c.id for c in cases])
    )
    table = _answer_table(task, cases, answers)
    labels = judged_labels(stage, table)
    named = table["exclusions"].to_pylist() if "exclusions" in table.column_names else None
    fails = table["fails"].to_pylist() if "fails" in table.column_names else None
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
            expected_fails=None if case.fails is None else list(case.fails),
            fails=None if fails is None else fails[i],
        )
        for i, (case, label, (_, status, error, usage, seconds)) in enumerate(
            zip(cases, labels, answers, strict=True)
        )
    ]


def measure(stage: str, results: Sequence[CaseResult], base_rate: float | None) -> dict[str, Any]:
    """One stage's figures: the binary the method reports (κ with its interval, sensitivity,
    specificity, precision at `base_rate`), agreement and κ over every label, the invalid rate
    and the per-answer means. `kappa` is the headline `--min-kappa` gates: the binary's, and for
    `strongest` (whose label is an index) the κ over the index."""
    gold = [r.expected for r in results]
    got = [r.got for r in results]
    n = len(results)
    statuses = Counter(r.status for r in results)
    unusable = sum(g is None for g in got)
    binary = None
    if stage != "strongest":
        binary = binary_report(
            [kept(stage, g) for g in gold], [kept(stage, g) for g in got], base_rate
        )
        headline, ci = binary["kappa"], binary["kappa_ci"]
    else:

        def kappa_of(idx: Any) -> float:
            return cohen_kappa([gold[i] for i in idx], [got[i] for i in idx])

        headline = round(cohen_kappa(gold, got), 4)
        interval = bootstrap(n, kappa_of)
        ci = None if interval is None else [round(interval[0], 4), round(interval[1], 4)]
    out: dict[str, Any] = {
        "cases": n,
        "ok": statuses.get("ok", 0),
        "invalid": statuses.get("invalid", 0),
        "failed": statuses.get("failed", 0),
        "invalid_rate": round(unusable / n, 4),
        "kappa": headline,
        "kappa_ci": ci,
        "binary": binary,
        "agreement": round(agreement(gold, got), 4),
        "kappa_labels": round(cohen_kappa(gold, got), 4),
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
    if stage == "write-queries":
        both = [r for r in results if r.expected == "reject" and r.got == "reject"]
        out["fails_named"] = {
            "same": sum(sorted(r.fails or []) == sorted(r.expected_fails or []) for r in both),
            "cases": len(both),
        }
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
    gold: Path | None = None,
) -> dict[str, Any]:
    """Measure each stage's judge on its gold cases and project a full build; the report as a
    dict (what `--out` writes). Starts the embedded local judge when no endpoint is configured.
    `pins_ignored`: the stages whose pins were dropped as the config loaded (the config's own
    pins, which are dropped here, are added to them). `gold`: a folder of STAGE.jsonl files
    instead of the shipped set."""
    from cpr_ray.llm.local_server import local_server

    loaded = {s: load_gold(s, gold_path(s, gold)) for s in stages}  # a bad file stops first
    cases = {s: select(c, limit) for s, c in loaded.items()}
    if root:
        storage = Storage(cfg.storage.model_copy(update={"root": root}))
        vol = volumes_from_root(cfg.dataset, storage)
    else:
        vol = volumes(cfg.dataset)
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
        rate = vol.rates.get(stage)
        measured = measure(stage, results[stage], None if rate is None else rate[0])
        report_stages.append(
            {
                "stage": stage,
                "model": llm.for_stage(build_stage(stage))[0],
                "base_rate_source": None if rate is None else rate[1],
                **measured,
                "gold": gold_summary(stage, loaded[stage]),
                "results": [asdict(r) for r in results[stage]],
            }
        )
    means = {s["stage"]: Measured(**s["mean"]) for s in report_stages}
    return {
        "endpoint": llm.base_url,
        "embedded_server": embedded,
        "same_verifier": llm.same_verifier() and "judge-transfer" in stages,
        "pins_ignored": pinned,
        "limit": limit,
        "stages": report_stages,
        "projection": project_build(llm, means, vol),
    }


def below(report: dict[str, Any], min_kappa: float) -> list[str]:
    """'STAGE κ K' for every stage whose headline κ is under `min_kappa`."""
    return [f"{s['stage']} κ {s['kappa']:.2f}" for s in report["stages"] if s["kappa"] < min_kappa]


def below_precision(report: dict[str, Any], min_precision: float) -> list[str]:
    """'STAGE precision P' for every stage whose precision at its base rate is under
    `min_precision` (or unknown: a judge that passed nothing cannot show it)."""
    out = []
    for s in report["stages"]:
        binary = s["binary"]
        if binary is None:
            continue
        ppv = binary["precision"]
        if ppv is None or ppv < min_precision:
            out.append(f"{s['stage']} precision {'n/a' if ppv is None else f'{ppv:.2f}'}")
    return out
