"""What the gold set itself is: its size, real and synthetic cases, classes, and how often its
two readers agreed — the analogue of the method's κ against a human — per stage.

Pure functions over loaded cases; `cpr judge-check --gold-report` prints this without an
endpoint, and every judge-check report carries it beside the judge's figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from cpr_ray.judge_check.agreement import agreement, bootstrap, cohen_kappa, one_miss_step
from cpr_ray.judge_check.gold import CITING_SENTENCES, CONTEXT_STAGES, GoldCase, kept
from cpr_ray.stages import STRONGEST

ONE_MISS_BAR = 0.05  # the bar: one miss moves the binarised κ by at most this


def gold_summary(stage: str, cases: Sequence[GoldCase]) -> dict[str, Any]:
    """Counts, class proportions, the κ step of one miss, and the readers' agreement."""
    labels = [c.label for c in cases]
    binary = [kept(stage, c.label) for c in cases]
    has_binary = stage != STRONGEST
    twice = [c for c in cases if len(c.readings) == 2]
    out: dict[str, Any] = {
        "cases": len(cases),
        "real": sum(not c.synthetic for c in cases),
        "synthetic": sum(c.synthetic for c in cases),
        "classes": {str(k): v for k, v in sorted(Counter(labels).items(), key=str)},
        "passes": sum(bool(b) for b in binary) if has_binary else None,
        "one_miss_kappa_step": one_miss_step(binary if has_binary else labels),
        # the stages that read citing sentences: real ones (what a build sends), invented, and
        # none (a marked minority a build no longer judges), counted apart
        "citing_sentences": (
            {k: sum(c.citing_sentence == k for c in cases) for k in CITING_SENTENCES}
            if stage in CONTEXT_STAGES
            else None
        ),
        "read_twice": len(twice),
        "adjudicated": sum(c.adjudication is not None for c in cases),
        "readings": None,
    }
    if twice:
        first = [c.readings[0].label for c in twice]
        second = [c.readings[1].label for c in twice]
        if has_binary:
            first, second = [kept(stage, x) for x in first], [kept(stage, x) for x in second]

        def kappa_of(idx: Any) -> float:
            return cohen_kappa([first[i] for i in idx], [second[i] for i in idx])

        ci = bootstrap(len(twice), kappa_of)
        out["readings"] = {
            "kappa": round(cohen_kappa(first, second), 4),
            "kappa_ci": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
            "agreement": round(agreement(first, second), 4),
            "agreement_labels": round(
                agreement(
                    [c.readings[0].label for c in twice], [c.readings[1].label for c in twice]
                ),
                4,
            ),
        }
    return out


def gold_lines(stage: str, summary: dict[str, Any]) -> list[str]:
    """The gold set of a stage in a few lines of at most 80 characters."""
    s = summary
    binary = "index" if stage == STRONGEST else "pass/not"
    lines = [
        f"  gold        {s['cases']} cases: {s['real']} real, {s['synthetic']} synthetic",
        *items("  classes     ", [f"{k} {v}" for k, v in s["classes"].items()]),
    ]
    if s["passes"] is not None:
        lines.append(f"              {s['passes']} pass, {s['cases'] - s['passes']} not")
    said = s.get("citing_sentences")
    if said is not None:
        lines.append(
            f"  sentences   {said['real']} real, {said['invented']} invented, "
            f"{said['none']} without a citing sentence"
        )
    step = s["one_miss_kappa_step"]
    flag = "" if step <= ONE_MISS_BAR else f" (over {ONE_MISS_BAR}: too few cases)"
    lines.append(f"  one miss    moves κ by {step:.3f}{flag}")
    r = s["readings"]
    if r is None:
        lines.append("  readers     no case read twice yet")
    else:
        ci = _ci(r["kappa_ci"])
        lines.append(
            f"  readers     κ {r['kappa']:.2f}{ci} ({binary}), agreement {r['agreement']:.2f}"
        )
        lines.append(
            f"              {s['read_twice']} read twice, {s['adjudicated']} adjudicated, "
            f"labels agree {r['agreement_labels']:.2f}"
        )
    return lines


def items(label: str, parts: list[str], width: int = 80) -> list[str]:
    """`parts` joined by commas after `label`, in lines of at most `width` characters, never
    splitting a part (a label and its count stay together)."""
    pieces = [p + "," for p in parts[:-1]] + parts[-1:]
    lines: list[str] = []
    words: list[str] = []
    for piece in pieces:
        prefix = label if not lines else " " * len(label)
        if words and len(prefix) + len(" ".join([*words, piece])) > width:
            lines.append(prefix + " ".join(words))
            words = []
        words.append(piece)
    prefix = label if not lines else " " * len(label)
    return [*lines, prefix + " ".join(words)]


def _ci(ci: list[float] | None) -> str:
    return "" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]"
