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
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

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


# -- the binary a build acts on: bootstrap intervals and precision at a corpus's base rate ------

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def sensitivity_specificity(
    gold: Sequence[bool], predicted: Sequence[bool | None]
) -> tuple[float | None, float | None]:
    """(share of gold passes the judge passes, share of gold non-passes it does not pass). A row
    without a usable answer is not passed, as in a build. None where the gold has no such row."""
    _same_length(gold, predicted)
    pos = [p is True for g, p in zip(gold, predicted, strict=True) if g]
    neg = [p is not True for g, p in zip(gold, predicted, strict=True) if not g]
    return (sum(pos) / len(pos) if pos else None, sum(neg) / len(neg) if neg else None)


def precision_at(sens: float | None, spec: float | None, base_rate: float) -> float | None:
    """The share of the judge's passes that are right in a corpus where `base_rate` of the rows
    deserve to pass (Bayes): PPV = sens·π / (sens·π + (1 − spec)·(1 − π)). A gold set balanced
    by design has π near ½; a build's rows do not, and at the analogy judge's ~9% a small
    false-pass rate on the other 91% outweighs the true passes. None when it passes nothing."""
    if sens is None or spec is None:
        return None
    passes = sens * base_rate + (1 - spec) * (1 - base_rate)
    return None if passes <= 0 else sens * base_rate / passes


def bootstrap(
    n: int,
    statistic: Callable[[np.ndarray], float | None],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """The 95% percentile interval of `statistic` over resamples of the n cases (with
    replacement, seeded: the same report twice gives the same interval). `statistic` gets the
    resampled case indices; a resample where it is undefined (None) is left out. None when no
    resample defines it."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        value = statistic(rng.integers(0, n, n))
        if value is not None:
            values.append(value)
    if not values:
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def _binary_resamples(
    gold: Sequence[bool], predicted: Sequence[bool | None], base_rate: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """(κ, PPV) of every bootstrap resample of the cases at once (NaN where undefined): the same
    statistics as `cohen_kappa` and `precision_at`, vectorised over BOOTSTRAP_RESAMPLES × n."""
    n = len(gold)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    idx = rng.integers(0, n, (BOOTSTRAP_RESAMPLES, n))
    g = np.asarray(gold, dtype=bool)[idx]
    # 1 pass, 0 not, -1 no usable answer (its own category: agrees with nothing, adds no p_e)
    j = np.asarray([-1 if p is None else int(p) for p in predicted])[idx]
    p_o = (g.astype(int) == j).mean(axis=1)
    g1, j1, j0 = g.mean(axis=1), (j == 1).mean(axis=1), (j == 0).mean(axis=1)
    p_e = g1 * j1 + (1 - g1) * j0
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(p_e >= 1.0, 1.0, (p_o - p_e) / (1.0 - p_e))
        sens = ((j == 1) & g).sum(axis=1) / g.sum(axis=1)
        spec = ((j != 1) & ~g).sum(axis=1) / (~g).sum(axis=1)
        if base_rate is None:
            return kappa, np.full(len(kappa), np.nan)
        passes = sens * base_rate + (1 - spec) * (1 - base_rate)
        ppv = np.where(passes > 0, sens * base_rate / passes, np.nan)
    return kappa, ppv


def _interval(values: np.ndarray) -> list[float] | None:
    """The 95% percentile interval of the defined resamples, rounded for the report."""
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def binary_report(
    gold: Sequence[bool], predicted: Sequence[bool | None], base_rate: float | None
) -> dict[str, Any]:
    """κ and agreement of the binary (with its bootstrap interval), sensitivity, specificity,
    and — given the base rate of the rows a build feeds this judge — the precision of its passes
    and the false passes per 100 (with intervals from the same resamples)."""
    _same_length(gold, predicted)
    sens, spec = sensitivity_specificity(gold, predicted)
    kappas, ppvs = _binary_resamples(gold, predicted, base_rate)
    out: dict[str, Any] = {
        "kappa": round(cohen_kappa(gold, predicted), 4),
        "kappa_ci": _interval(kappas),
        "agreement": round(agreement(gold, predicted), 4),
        "sensitivity": None if sens is None else round(sens, 4),
        "specificity": None if spec is None else round(spec, 4),
        "base_rate": base_rate,
        "precision": None,
        "precision_ci": None,
        "false_per_100": None,
        "false_per_100_ci": None,
    }
    if base_rate is None:
        return out
    ppv, ci = precision_at(sens, spec, base_rate), _interval(ppvs)
    out["precision"] = None if ppv is None else round(ppv, 4)
    out["precision_ci"] = ci
    if ppv is not None:
        out["false_per_100"] = round(100 * (1 - ppv), 1)
    if ci is not None:
        out["false_per_100_ci"] = [round(100 * (1 - ci[1]), 1), round(100 * (1 - ci[0]), 1)]
    return out


def one_miss_step(gold: Sequence[Hashable]) -> float:
    """How far one miss moves κ from a perfect judge's 1.0 on this gold set: the judge misses
    one case of the rarest label (calling it the commonest). The gold needs enough cases in
    every class for this to stay small (the issue's bar: ≤ 0.05)."""
    counts = Counter(gold)
    if len(counts) < 2:
        return 1.0
    rare = min(counts, key=counts.get)
    common = max((k for k in counts if k != rare), key=counts.get)
    i = list(gold).index(rare)
    missed = [*gold[:i], common, *gold[i + 1 :]]
    return round(1.0 - cohen_kappa(gold, missed), 4)


def _rounded(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]
