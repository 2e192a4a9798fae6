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
a sample that leaves one gold label can produce it, which is why `cpr judge-check` refuses a gate
on such a sample (`check.degenerate_gates`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import beta

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


# -- the binary a build acts on: exact intervals, and precision at a corpus's base rate ---------

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95  # every interval of the report: two-sided, so a lower bound holds at 97.5%
# Rogan–Gladen divides by sens + spec − 1: at or under this the judge is too close to chance for
# its own pass share to say anything about the rows' true rate
MIN_YOUDEN = 0.1


def sensitivity_specificity(
    gold: Sequence[bool], predicted: Sequence[bool | None]
) -> tuple[float | None, float | None]:
    """(share of gold passes the judge passes, share of gold non-passes it does not pass). A row
    without a usable answer is not passed, as in a build. None where the gold has no such row."""
    (tp, pos), (tn, neg) = _counts(gold, predicted)
    return (tp / pos if pos else None, tn / neg if neg else None)


def _counts(
    gold: Sequence[bool], predicted: Sequence[bool | None]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """((true passes, gold passes), (true non-passes, gold non-passes))."""
    _same_length(gold, predicted)
    pos = [p is True for g, p in zip(gold, predicted, strict=True) if g]
    neg = [p is not True for g, p in zip(gold, predicted, strict=True) if not g]
    return (sum(pos), len(pos)), (sum(neg), len(neg))


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The exact binomial interval of a share k/n: it never collapses, so a judge with no false
    pass on n cases still has a specificity interval below 1 (its width is what n buys)."""
    if n <= 0:
        return None
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - tail, k + 1, n - k))
    return low, high


def precision_at(sens: float | None, spec: float | None, base_rate: float) -> float | None:
    """The share of the judge's passes that are right in a corpus where `base_rate` of the rows
    deserve to pass (Bayes): PPV = sens·π / (sens·π + (1 − spec)·(1 − π)). A gold set balanced
    by design has π near ½; a build's rows do not, and at the analogy judge's ~9% a small
    false-pass rate on the other 91% outweighs the true passes. None when it passes nothing."""
    if sens is None or spec is None:
        return None
    passes = sens * base_rate + (1 - spec) * (1 - base_rate)
    return None if passes <= 0 else sens * base_rate / passes


def precision_interval(
    sens_ci: tuple[float, float] | None,
    spec_ci: tuple[float, float] | None,
    rate_ci: tuple[float, float],
) -> tuple[float, float] | None:
    """Precision's interval from those of sensitivity, specificity and the base rate: precision
    rises with each, so its bounds are at the corners (low with low, high with high). Taking
    every input at its bound makes the interval conservative: it covers at least as often as
    its inputs' intervals do together."""
    if sens_ci is None or spec_ci is None:
        return None
    low = precision_at(sens_ci[0], spec_ci[0], rate_ci[0])
    high = precision_at(sens_ci[1], spec_ci[1], rate_ci[1])
    return (0.0 if low is None else low, 0.0 if high is None else high)


def rogan_gladen(share: float, sens: float, spec: float) -> float:
    """The true rate behind an observed pass share, given the judge's sensitivity and
    specificity: π = (p + spec − 1) / (sens + spec − 1), clipped to [0, 1]. The judge's own pass
    share is not the rate: a judge of sensitivity 0.9 and specificity 0.6 passes 44.5% of rows
    whose true rate is 9%."""
    youden = sens + spec - 1
    if youden <= MIN_YOUDEN:
        raise ValueError(
            f"sensitivity + specificity − 1 is {youden:.2f} on the gold (≤ {MIN_YOUDEN}): the "
            "judge is too close to chance to correct its pass share (Rogan–Gladen)"
        )
    return min(max((share + spec - 1) / youden, 0.0), 1.0)


def rogan_gladen_interval(
    share_ci: tuple[float, float], sens_ci: tuple[float, float], spec_ci: tuple[float, float]
) -> tuple[float, float]:
    """The corrected rate's interval: its extremes over the corners of the three intervals (the
    rate is monotone in each); [0, 1] when some corner is no better than chance."""
    values = []
    for p in share_ci:
        for se in sens_ci:
            for sp in spec_ci:
                if se + sp - 1 <= 0:
                    return 0.0, 1.0
                values.append(min(max((p + sp - 1) / (se + sp - 1), 0.0), 1.0))
    return min(values), max(values)


@dataclass(frozen=True)
class BaseRate:
    """The share of a stage's rows in a build that deserve to pass, and where it comes from:
    an assumption or another judge's measured precision (`value`, with `ci` when measured), or
    a build's observed pass share (`observed`: passed and judged rows), which `binary_report`
    corrects with the gold's sensitivity and specificity (Rogan–Gladen)."""

    source: str
    value: float | None = None
    ci: tuple[float, float] | None = None
    observed: tuple[int, int] | None = None


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


def _kappa_resamples(gold: Sequence[bool], predicted: Sequence[bool | None]) -> np.ndarray:
    """κ of every bootstrap resample of the cases at once: the same statistic as
    `cohen_kappa`, vectorised over BOOTSTRAP_RESAMPLES × n."""
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
        return np.where(p_e >= 1.0, 1.0, (p_o - p_e) / (1.0 - p_e))


def _interval(values: np.ndarray) -> list[float] | None:
    """The 95% percentile interval of the defined resamples, rounded for the report."""
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def binary_report(
    gold: Sequence[bool], predicted: Sequence[bool | None], rate: BaseRate | None
) -> dict[str, Any]:
    """κ and agreement of the binary (κ's interval by bootstrap), sensitivity and specificity
    with exact intervals, and — given the base rate of the rows a build feeds this judge — the
    precision of its passes and the false passes per 100, with the interval derived from them.
    A rate observed in a build is first corrected (Rogan–Gladen; ValueError when the judge is
    too close to chance for that)."""
    _same_length(gold, predicted)
    (tp, pos), (tn, neg) = _counts(gold, predicted)
    sens, spec = sensitivity_specificity(gold, predicted)
    sens_ci, spec_ci = clopper_pearson(tp, pos), clopper_pearson(tn, neg)
    out: dict[str, Any] = {
        "kappa": round(cohen_kappa(gold, predicted), 4),
        "kappa_ci": _interval(_kappa_resamples(gold, predicted)),
        "agreement": round(agreement(gold, predicted), 4),
        "sensitivity": None if sens is None else round(sens, 4),
        "sensitivity_ci": _rounded(sens_ci),
        "specificity": None if spec is None else round(spec, 4),
        "specificity_ci": _rounded(spec_ci),
        "base_rate": None,
        "base_rate_ci": None,
        "base_rate_source": None,
        "observed_pass_share": None,
        "precision": None,
        "precision_ci": None,
        "false_per_100": None,
        "false_per_100_ci": None,
    }
    if rate is None:
        return out
    value, rate_ci = rate.value, rate.ci
    if rate.observed is not None:
        passed, judged = rate.observed
        share, share_ci = passed / judged, clopper_pearson(passed, judged)
        if sens is None or spec is None or sens_ci is None or spec_ci is None or share_ci is None:
            raise ValueError("the gold needs passes and non-passes to correct a pass share")
        value = rogan_gladen(share, sens, spec)
        rate_ci = rogan_gladen_interval(share_ci, sens_ci, spec_ci)
        out["observed_pass_share"] = round(share, 4)
    assert value is not None
    rate_ci = rate_ci or (value, value)
    out["base_rate"], out["base_rate_ci"] = round(value, 4), _rounded(rate_ci)
    out["base_rate_source"] = rate.source
    ppv = precision_at(sens, spec, value)
    ci = precision_interval(sens_ci, spec_ci, rate_ci)
    out["precision"] = None if ppv is None else round(ppv, 4)
    out["precision_ci"] = _rounded(ci)
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
    rare = min(counts, key=counts.__getitem__)
    common = max((k for k in counts if k != rare), key=counts.__getitem__)
    i = list(gold).index(rare)
    missed = [*gold[:i], common, *gold[i + 1 :]]
    return round(1.0 - cohen_kappa(gold, missed), 4)


def _rounded(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]
