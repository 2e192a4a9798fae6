"""Agreement and Cohen's κ between a judge and the gold labels (pure functions).

κ corrects raw agreement for the agreement two raters would reach by chance with their own label
frequencies: κ = (p_o − p_e) / (1 − p_e), p_o the share of cases where they agree, p_e = Σ_k
p_gold(k) · p_judge(k). A judge that answers one label whatever the case gets κ = 0, however
often that label is right, which is why κ and not agreement is the bar a judge must clear.

A case the judge did not answer usably (invalid after re-asks, failed in transport) is its own
category, `invalid`: it never agrees with a gold label and adds nothing to p_e (the gold never
says `invalid`), so it lowers κ exactly as a wrong answer would.

Degenerate case: p_e = 1 happens only when both raters gave one and the same label to every case,
and then p_o = 1 too. κ is 0/0 there; we define it as 1.0 (the judge agreed on every case). Only
a `--limit` small enough to leave one gold label can produce it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

INVALID = "invalid"


def _categories(predicted: Sequence[Hashable | None]) -> list[Hashable]:
    return [INVALID if p is None else p for p in predicted]


def agreement(gold: Sequence[Hashable], predicted: Sequence[Hashable | None]) -> float:
    """Share of cases where the judge's label equals the gold label (None: no usable answer)."""
    _same_length(gold, predicted)
    return sum(g == p for g, p in zip(gold, predicted, strict=True)) / len(gold)


def cohen_kappa(gold: Sequence[Hashable], predicted: Sequence[Hashable | None]) -> float:
    """Cohen's κ of the judge against the gold (see the module docstring for the conventions)."""
    _same_length(gold, predicted)
    judged = _categories(predicted)
    n = len(gold)
    p_o = sum(g == p for g, p in zip(gold, judged, strict=True)) / n
    gold_counts, judged_counts = Counter(gold), Counter(judged)
    p_e = sum(gold_counts[k] * judged_counts.get(k, 0) for k in gold_counts) / (n * n)
    if p_e >= 1.0:
        return 1.0
    return (p_o - p_e) / (1.0 - p_e)


def at_least(labels: Sequence[Any], threshold: int) -> list[bool | None]:
    """Scores binarised at `threshold` (the method reports the graders' κ binarised at 2)."""
    return [None if s is None else s >= threshold for s in labels]


def confusion(gold: Sequence[Hashable], predicted: Sequence[Hashable | None]) -> dict[str, Any]:
    """{gold label: {judged label: count}}, labels as strings (for the JSON report)."""
    table: dict[str, dict[str, int]] = {}
    for g, p in zip(gold, _categories(predicted), strict=True):
        row = table.setdefault(str(g), {})
        row[str(p)] = row.get(str(p), 0) + 1
    return table


def _same_length(gold: Sequence[Any], predicted: Sequence[Any]) -> None:
    if not gold:
        raise ValueError("agreement needs at least one case")
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold labels but {len(predicted)} judged labels")
