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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from cpr_ray.config import Config, LLMConfig
from cpr_ray.errors import UserError
from cpr_ray.judge_check.agreement import (
    BaseRate,
    agreement,
    binary_report,
    bootstrap,
    cohen_kappa,
    confusion,
)
from cpr_ray.judge_check.gold import (
    EXCLUSIONS,
    JUDGE_STAGES,
    LABELS,
    NOT_TAKEN,
    GoldCase,
    build_stage,
    gold_path,
    kept,
    load_gold,
    select,
)
from cpr_ray.judge_check.gold_report import gold_summary
from cpr_ray.judge_check.projection import (
    PASS_RATES,
    Measured,
    Volumes,
    project_build,
    volumes,
    volumes_from_root,
)
from cpr_ray.judge_check.tasks import judged_label, make_task
from cpr_ray.llm.client import LLMClient, Usage, probe_endpoint
from cpr_ray.llm.task import LLMTask
from cpr_ray.runs.stage_runner import console
from cpr_ray.stages import JUDGE_ANALOGY, JUDGE_TRANSFER, STRONGEST, WRITE_QUERIES
from cpr_ray.storage.store import Storage


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
    purpose: str | None = None  # the citation set's purpose label of a real case (never asked)


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
            purpose=case.purpose,
        )
        for i, (case, label, (_, status, error, usage, seconds)) in enumerate(
            zip(cases, labels, answers, strict=True)
        )
    ]


# the passing label the purpose-label block counts, per stage it applies to
OBSERVED: dict[str, str] = {JUDGE_ANALOGY: "observed_analogy", JUDGE_TRANSFER: "transfer"}


def measure(stage: str, results: Sequence[CaseResult], rate: BaseRate | None) -> dict[str, Any]:
    """One stage's figures: the binary the method reports (κ with its interval, sensitivity and
    specificity with exact intervals, precision at the stage's base rate), agreement and κ over
    every label, the invalid rate and the per-answer means. `kappa` is the headline the κ gate
    reads (its interval's lower bound): the binary's, and for `strongest` (whose label is an
    index) the κ over the index. ValueError when a build's pass share cannot be corrected."""
    gold = [r.expected for r in results]
    got = [r.got for r in results]
    n = len(results)
    statuses = Counter(r.status for r in results)
    unusable = sum(g is None for g in got)
    binary = None
    if stage != STRONGEST:
        truth = [k for k in (kept(stage, g) for g in gold) if k is not None]
        assert len(truth) == n  # every gold case has a label, and this stage a binary
        binary = binary_report(truth, [kept(stage, g) for g in got], rate)
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
    if stage == JUDGE_ANALOGY:
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
    if stage in OBSERVED:
        out["observed_on_not_taken"] = observed_on_not_taken(stage, results)
    if stage == WRITE_QUERIES:
        both = [r for r in results if r.expected == "reject" and r.got == "reject"]
        out["fails_named"] = {
            "same": sum(sorted(r.fails or []) == sorted(r.expected_fails or []) for r in both),
            "cases": len(both),
        }
    return out


def observed_on_not_taken(stage: str, results: Sequence[CaseResult]) -> dict[str, Any] | None:
    """How the judge's passes as observed fall on citations whose human purpose label says q
    took nothing from d (background, comparison, future work): each such pass is one the citing
    sentence contradicts. None when the sample holds no labelled citation."""
    labelled = [r for r in results if r.purpose is not None]
    if not labelled:
        return None
    not_taken = [r for r in labelled if r.purpose in NOT_TAKEN]
    passed = [r for r in labelled if r.got == OBSERVED[stage]]
    return {
        "passed": sum(r.purpose in NOT_TAKEN for r in passed),  # N
        "citations": len(not_taken),  # M
        "gold_passed": sum(r.expected == OBSERVED[stage] for r in not_taken),
        "passed_labelled": len(passed),
        "by_purpose": dict(sorted(Counter(r.purpose for r in passed).items())),
    }


def without_pins(llm: LLMConfig) -> LLMConfig:
    """`llm` with every stage's pins dropped: a pinned judge's agreement would measure the pin."""
    stages = {k: v.model_copy(update={"pin": {}}) for k, v in llm.stages.items()}
    return llm.model_copy(update={"stages": stages})


MIN_SIDE = 10  # cases a gated binary needs on each side, or its interval says nothing


def degenerate_gates(cases: Mapping[str, Sequence[GoldCase]], limit: int | None) -> str | None:
    """Why a gate over these cases would mean nothing (None: it means something): a sample
    (`--limit`) measures the sample, and a stage with too few cases on one side of its gated
    label can be passed by a judge that answers one class (κ is even defined as 1.0 on one)."""
    if limit is not None:
        return (
            "a gate (--min-kappa, --min-precision) is refused with --limit: a sample can be "
            "passed by a judge that answers its majority class; drop --limit to gate"
        )
    for stage, stage_cases in cases.items():
        if stage == STRONGEST:
            if len({c.label for c in stage_cases}) < 2:
                return f"{stage}: its gold holds one index only; a gate on it means nothing"
            continue
        passes = sum(bool(kept(stage, c.label)) for c in stage_cases)
        rest = len(stage_cases) - passes
        if min(passes, rest) < MIN_SIDE:
            return (
                f"{stage}: its gold holds {passes} passing and {rest} other case(s); a gate "
                f"needs {MIN_SIDE} on each side (a one-class judge would pass it)"
            )
    return None


def ledger_models(storage: Storage, stage: str) -> set[str]:
    """The models a build's ledger names for a stage's answers."""
    from cpr_ray.llm.spend_ledger import LEDGER, ledger_uri
    from cpr_ray.tables.compaction import read_parts

    table = read_parts(storage, ledger_uri(storage, stage), LEDGER)
    return {m for m in table["model"].to_pylist() if m}


def base_rates(
    vol: Volumes, stages: Sequence[str], llm: LLMConfig, storage: Storage | None
) -> dict[str, BaseRate]:
    """Each stage's base rate before measuring: a build's observed pass share (corrected later
    with the gold's sensitivity and specificity) under `--root`, else the named assumption.
    A build whose ledger names another model than the one measured is refused: its pass share
    says nothing about this judge's errors."""
    out: dict[str, BaseRate] = {}
    for stage in stages:
        if stage == STRONGEST:
            continue
        observed = vol.observed.get(stage)
        if observed is not None and storage is not None:
            model = llm.for_stage(build_stage(stage))[0]
            others = ledger_models(storage, build_stage(stage)) - {model}
            if others:
                raise UserError(
                    f"--root: the build's {stage} answers come from {', '.join(sorted(others))}, "
                    f"not {model}: its pass share cannot be corrected with this judge's "
                    "sensitivity and specificity (Rogan–Gladen refused)"
                )
            passed, judged = observed
            out[stage] = BaseRate(
                f"{storage.root} {stage}: {passed:,} of {judged:,} passed, corrected "
                "(Rogan–Gladen) with the gold's sensitivity and specificity",
                observed=observed,
            )
        else:
            value, source = PASS_RATES[stage]
            out[stage] = BaseRate(f"assumed: {source}", value=value)
    return out


def analogy_precision_rate(analogy: dict[str, Any]) -> BaseRate | None:
    """The verifier's base rate: what reaches it is what the analogy judge passed, so the share
    that deserves to pass is that judge's measured precision (None when it has none)."""
    b = analogy["binary"]
    if b is None or b["precision"] is None or b["precision_ci"] is None:
        return None
    return BaseRate(
        "the analogy judge's measured precision (the verifier sees what it passed)",
        value=b["precision"],
        ci=tuple(b["precision_ci"]),
    )


def check_judges(
    cfg: Config,
    stages: Sequence[str] = JUDGE_STAGES,
    *,
    limit: int | None = None,
    root: str | None = None,
    pins_ignored: Sequence[str] | None = None,
    gold: Path | None = None,
    gated: bool = False,
) -> dict[str, Any]:
    """Measure each stage's judge on its gold cases and project a full build; the report as a
    dict (what `--out` writes). Starts the embedded local judge when no endpoint is configured.
    `pins_ignored`: the stages whose pins were dropped as the config loaded (the config's own
    pins, which are dropped here, are added to them). `gold`: a folder of STAGE.jsonl files
    instead of the shipped set. `gated`: a gate will read the report, so a degenerate one is
    refused first, before any request."""
    from cpr_ray.llm.local_server import local_server

    loaded = {s: load_gold(s, gold_path(s, gold)) for s in stages}  # a bad file stops first
    cases = {s: select(c, limit) for s, c in loaded.items()}
    if gated:
        refused = degenerate_gates(cases, limit)
        if refused:
            raise UserError(f"judge-check: {refused}")
    storage = None
    if root:
        storage = Storage(cfg.storage.model_copy(update={"root": root}))
        vol = volumes_from_root(cfg.dataset, storage)
    else:
        vol = volumes(cfg.dataset)
    pinned = sorted({*(pins_ignored or ()), *(s for s, o in cfg.llm.stages.items() if o.pin)})
    llm = without_pins(cfg.llm)
    rates = base_rates(vol, stages, llm, storage)
    embedded = not llm.base_url
    results: dict[str, list[CaseResult]] = {}
    if embedded:
        with local_server() as url:
            llm = llm.model_copy(update={"base_url": url})
            for stage in stages:
                results[stage] = run_stage(stage, cases[stage], llm, url)
    else:
        assert llm.base_url is not None  # not embedded
        for stage in stages:
            results[stage] = run_stage(stage, cases[stage], llm, llm.base_url)
    report_stages: list[dict[str, Any]] = []
    for stage in stages:
        if stage == JUDGE_TRANSFER and report_stages and report_stages[0]["stage"] == JUDGE_ANALOGY:
            rates[stage] = analogy_precision_rate(report_stages[0]) or rates[stage]
        try:
            measured = measure(stage, results[stage], rates.get(stage))
        except ValueError as exc:
            raise UserError(f"judge-check: {stage}: {exc}") from None
        report_stages.append(
            {
                "stage": stage,
                "model": llm.for_stage(build_stage(stage))[0],
                "base_rate_source": None if stage not in rates else rates[stage].source,
                **measured,
                "gold": gold_summary(stage, loaded[stage]),
                "results": [asdict(r) for r in results[stage]],
            }
        )
    means = {s["stage"]: Measured(**s["mean"]) for s in report_stages}
    return {
        "endpoint": llm.base_url,
        "embedded_server": embedded,
        "same_verifier": llm.same_verifier() and JUDGE_TRANSFER in stages,
        "pins_ignored": pinned,
        "limit": limit,
        "stages": report_stages,
        "projection": project_build(llm, means, vol),
    }


def below(report: dict[str, Any], min_kappa: float) -> list[str]:
    """'STAGE κ lower bound K' for every stage whose κ interval's lower bound is under
    `min_kappa`: a point estimate on a few cases is passed by luck as often as not."""
    out = []
    for s in report["stages"]:
        ci = s["kappa_ci"]
        if ci is None or ci[0] < min_kappa:
            out.append(f"{s['stage']} κ lower bound {'n/a' if ci is None else f'{ci[0]:.2f}'}")
    return out


def below_precision(report: dict[str, Any], min_precision: float) -> list[str]:
    """'STAGE precision lower bound P' for every stage whose precision interval's lower bound at
    its base rate is under `min_precision` (or unknown: a judge that passed nothing cannot show
    it). Where the base rate itself exceeds the bar, a judge that passes everything clears it:
    the κ gate is what stops that judge."""
    out = []
    for s in report["stages"]:
        binary = s["binary"]
        if binary is None:
            continue
        ci = binary["precision_ci"]
        if binary["precision"] is None or ci is None or ci[0] < min_precision:
            low = "n/a" if ci is None or binary["precision"] is None else f"{ci[0]:.2f}"
            out.append(f"{s['stage']} precision lower bound {low}")
    return out
