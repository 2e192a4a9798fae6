"""What a full build would cost with the judges just measured: rows, calls, tokens, USD, hours.

Every LLM stage of a build is projected, in the order a build runs them:

- rows: how many rows each stage asks about, carried down from the pairs judged for analogy
  through each stage's pass rate (`PASS_RATES`); at full scale the method's 132k pairs, with
  `--root BUILD` that build's own counts (the rows each published stage judged and the share it
  passed, and below its last published stage, its mined pairs carried through the rates);
- per row: the means judge-check measured on the gold cases where it ran the stage, and the
  dry run's ledger means (benchmarks/SCALE.md) for what it does not run (query extraction and
  rewriting, synthesis);
- query writing regenerates a rejected query at most twice, so a row costs its three calls
  times 1 + (1 − a) + (1 − a)² attempts at a review accept rate a;
- dedup compares the queries of one base paper pairwise: with λ queries per base paper (spread
  as a Poisson count), about λ²/2 comparisons per base paper; one strongest-analogy call per
  same-problem group;
- negatives are *judged*, not kept: the walk judges, per group still short, the negatives it
  lacks plus `dataset.negatives_margin` of them, and walks on where candidates were useful, so
  it judges about kept × max(1 + margin, 1 / r) candidates when a share r of them are negatives.

USD is tokens × `llm.prices[model]`, plus, on a self-hosted fleet priced by the node-hour
(`llm.fleet`), each stage's hours × `llm.fleet.nodes` × `llm.fleet.node_hour_usd` (what the spend
ledger charges a stage while it asks); the total is compared with `llm.max_usd` (the build's
spend cap, `cpr_ray/llm/spend.py`). Hours assume the endpoint keeps every actor's requests in
flight at the latency measured here: hours = rows × s/row ÷ (llm.actors × llm.max_in_flight) ÷
3600.

USD with a prefix cache bills the share of each stage's prompt tokens a prefix cache reuses when
the build asks rows whose prompts open alike one after another (`PREFIX_SHARES`, measured and
projected to a full build's rows per group by benchmarks/prompt_prefix.py) at
`llm.prices[model].cached_input_per_mtok`, the rest as without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cpr_ray.config import Config, DatasetConfig, LLMConfig
from cpr_ray.errors import StorageError
from cpr_ray.judge_check.gold import JUDGE_STAGES, build_stage
from cpr_ray.runs.stage_runner import read_manifest
from cpr_ray.stages import (
    DEDUP,
    JUDGE_ANALOGY,
    JUDGE_NEGATIVES,
    JUDGE_TRANSFER,
    MINE,
    SCORE_POSITIVES,
    STRONGEST,
    SYNTHESIZE_QUERIES,
    WRITE_QUERIES,
)
from cpr_ray.storage.store import Storage, join

# the stages a build asks an LLM, in build order (strongest: the dedup stage's second call):
# every judged stage, then synthesis, which judge-check does not measure
BUILD_ORDER: tuple[str, ...] = (*JUDGE_STAGES, SYNTHESIZE_QUERIES)
# the method at full scale (METHOD.md §3.2–3.4): ~132k cross-topic pairs judged for ~12k
# positives, from ~9.2k base papers; 26 fields
FULL_SCALE_PAIRS = 132_000
FULL_SCALE_BASE_PAPERS = 9_217
FIELDS = 26
NEGATIVE_GROUPS = 3
# The share of its rows each judge passes, which is also the base rate its precision is read
# at (a judge that is right passes the rows that deserve it). Only the analogy judgment's is
# stated by the method; the others are assumptions a build's own counts replace (--root).
PASS_RATES: dict[str, tuple[float, str]] = {
    JUDGE_ANALOGY: (0.09, "METHOD.md: ~91% of cross-topic pairs discarded"),
    JUDGE_TRANSFER: (0.9, "assumed (METHOD.md states none)"),
    WRITE_QUERIES: (0.8, "assumed per review (METHOD.md states none)"),
    DEDUP: (0.2, "assumed share of same-problem comparisons"),
    SCORE_POSITIVES: (0.9, "assumed (METHOD.md states none)"),
    JUDGE_NEGATIVES: (0.9, "assumed share of pooled candidates scoring ≤ 1"),
}
# per-row means of the dry run's ledger (benchmarks/SCALE.md, "LLM calls and tokens per
# stage") for the calls judge-check does not make: query extraction and rewriting (two of the
# three calls of an attempt), and synthesis; and for any stage left out of --stages
LEDGER_MEANS: dict[str, tuple[float, float, float]] = {  # calls, prompt, completion per row
    JUDGE_ANALOGY: (1.0, 1344, 924),
    JUDGE_TRANSFER: (1.0, 1171, 38),
    WRITE_QUERIES: (3.0, 958, 106),
    DEDUP: (1.0, 175, 25),
    STRONGEST: (1.0, 427, 63),
    SCORE_POSITIVES: (1.0, 560, 88),
    JUDGE_NEGATIVES: (1.0, 547, 122),
    SYNTHESIZE_QUERIES: (1.0, 427, 63),
}
LEDGER_SOURCE = "benchmarks/SCALE.md dry-run ledger"
# the share of a stage's prompt tokens that vLLM's prefix caching and hosted prompt caches
# reuse, with rows asked in the runner's order (`LLMTask.in_ask_order`) at a full build's rows
# per query paper or question: the reusable share benchmarks/prompt_prefix.py projects from the
# gold cases' sample texts (MiniLM WordPiece standing in for the judges' tokenizers; table in
# benchmarks/SCALE.md). write-queries: its review's, for all three calls; synthesis: not
# measured, so no discount.
PREFIX_SHARES: dict[str, float] = {
    JUDGE_ANALOGY: 0.793,
    JUDGE_TRANSFER: 0.480,
    WRITE_QUERIES: 0.618,
    DEDUP: 0.869,
    STRONGEST: 0.118,
    SCORE_POSITIVES: 0.369,
    JUDGE_NEGATIVES: 0.405,
    SYNTHESIZE_QUERIES: 0.0,
}
PREFIX_SOURCE = "benchmarks/prompt_prefix.py; SCALE.md"
HOURS_FORMULA = "hours = rows × s/row ÷ (llm.actors × llm.max_in_flight) ÷ 3600"


@dataclass(frozen=True)
class Measured:
    """Per-answer means of one stage's gold run (every case counts, answered or not)."""

    calls: float
    prompt_tokens: float
    completion_tokens: float
    seconds: float


@dataclass(frozen=True)
class Volumes:
    """Rows per stage, where they came from, and the pass rates used (also the base rates)."""

    rows: dict[str, int]
    rates: dict[str, tuple[float, str]]
    source: str
    # per published judged stage of a build: (rows it passed, rows it judged), the observed pass
    # share its base rate is corrected from (dedup: same-problem links of its comparisons)
    observed: dict[str, tuple[int, int]] = field(default_factory=dict)


def attempts(accept_rate: float) -> float:
    """Expected attempts of query writing: the first, and up to two regenerations."""
    reject = 1.0 - accept_rate
    return 1.0 + reject + reject**2


def volumes(
    ds: DatasetConfig,
    pairs: int = FULL_SCALE_PAIRS,
    base_papers: int | None = None,
    rates: dict[str, tuple[float, str]] | None = None,
    judged: dict[str, int] | None = None,
    source: str = "the method at full scale (METHOD.md; benchmarks/SCALE.md)",
) -> Volumes:
    """Rows per LLM stage from the pairs judged for analogy, carried through the pass rates.
    `judged`: rows a build's published stages really judged, used instead of the estimate."""
    rates = {**PASS_RATES, **(rates or {})}
    judged = judged or {}
    base = base_papers or round(FULL_SCALE_BASE_PAPERS * pairs / FULL_SCALE_PAIRS)
    r = {s: v for s, (v, _) in rates.items()}
    rows: dict[str, float] = {JUDGE_ANALOGY: judged.get(JUDGE_ANALOGY, pairs)}
    rows[JUDGE_TRANSFER] = judged.get(JUDGE_TRANSFER, rows[JUDGE_ANALOGY] * r[JUDGE_ANALOGY])
    rows[WRITE_QUERIES] = judged.get(WRITE_QUERIES, rows[JUDGE_TRANSFER] * r[JUDGE_TRANSFER])
    written = rows[WRITE_QUERIES] * (1 - (1 - r[WRITE_QUERIES]) ** 3)
    per_base = written / base if base else 0.0
    rows[DEDUP] = judged.get(DEDUP, base * per_base**2 / 2)
    rows[STRONGEST] = rows[DEDUP] * r[DEDUP]
    kept_queries = max(written - rows[STRONGEST], 0.0)
    rows[SCORE_POSITIVES] = judged.get(SCORE_POSITIVES, kept_queries)
    positives = rows[SCORE_POSITIVES] * r[SCORE_POSITIVES]
    eval_queries = min(positives, ds.eval_per_field * FIELDS)
    train_pairs = positives - eval_queries
    negatives = NEGATIVE_GROUPS * (
        eval_queries * ds.eval_negatives_per_group + train_pairs * ds.train_negatives_per_group
    )
    walk = max(1 + ds.negatives_margin, 1 / r[JUDGE_NEGATIVES])
    rows[JUDGE_NEGATIVES] = judged.get(JUDGE_NEGATIVES, negatives * walk)
    rows[SYNTHESIZE_QUERIES] = train_pairs
    return Volumes({s: round(v) for s, v in rows.items()}, rates, source)


def volumes_from_root(ds: DatasetConfig, storage: Storage) -> Volumes:
    """The build at `storage`'s root: its mined pairs, and for every published judged stage the
    rows it judged and the share it passed (its own base rate)."""
    manifest = read_manifest(storage, MINE)
    if manifest is None:
        raise StorageError(
            f"{storage.root} has no published mine stage (mine/_MANIFEST.json): --root needs a "
            "build mined at least through `mine`"
        )
    try:
        pairs = int(manifest["tables"]["pairs"]["rows"])
    except (KeyError, TypeError, ValueError):
        raise StorageError(f"{storage.root}: the mine manifest records no pairs table") from None
    judged: dict[str, int] = {}
    rates: dict[str, tuple[float, str]] = {}
    observed: dict[str, tuple[int, int]] = {}
    for stage in PASS_RATES:
        stats = (read_manifest(storage, stage) or {}).get("stats") or {}
        if stats.get("rows_in"):
            judged[stage] = int(stats["rows_in"])
            rates[stage] = (float(stats["rows_out"]) / judged[stage], f"{storage.root} {stage}")
            observed[stage] = (int(stats["rows_out"]), judged[stage])
        if stage == DEDUP and stats.get("comparisons"):
            # the gated binary is "same problem" per comparison, not the share of queries kept
            observed[stage] = (int(stats.get("same_problem_links") or 0), int(stats["comparisons"]))
    published = f"; the rows and pass rates of {', '.join(judged)}" if judged else ""
    source = f"{pairs:,} mined pairs of {storage.root}{published}"
    vol = volumes(ds, pairs, rates=rates, judged=judged, source=source)
    return Volumes(vol.rows, vol.rates, vol.source, observed)


def per_row(
    stage: str, measured: dict[str, Measured], rates: dict[str, tuple[float, str]]
) -> tuple[Measured, str]:
    """(calls, tokens and seconds per row of a build stage, where they come from)."""
    calls, prompt, completion = LEDGER_MEANS[stage]
    if stage == WRITE_QUERIES:
        # extraction and rewriting from the ledger (2 of an attempt's 3 calls), the review as
        # measured where judge-check ran it, every call once per attempt
        n = attempts(rates[WRITE_QUERIES][0])
        review = measured.get(stage)
        if review is None:
            return Measured(calls * n, prompt * n, completion * n, 0.0), LEDGER_SOURCE
        two = 2 / 3
        return (
            Measured(
                n * (calls * two + review.calls),
                n * (prompt * two + review.prompt_tokens),
                n * (completion * two + review.completion_tokens),
                n * 3 * review.seconds,
            ),
            "review measured, extract + rewrite from the ledger",
        )
    if stage in measured:
        return measured[stage], "measured here"
    return Measured(calls, prompt, completion, 0.0), LEDGER_SOURCE


def project(stage: str, rows: int, means: Measured, llm: LLMConfig) -> dict[str, Any]:
    """A build stage's calls, tokens, USD (None without a price for its model) and hours (None
    where the seconds were not measured)."""
    model = llm.for_stage(build_stage(stage))[0]
    prompt = rows * means.prompt_tokens
    completion = rows * means.completion_tokens
    price = llm.prices.get(model)
    usd = usd_cached = None
    if price is not None:
        usd = prompt / 1e6 * price.input_per_mtok + completion / 1e6 * price.output_per_mtok
        shared = prompt * PREFIX_SHARES.get(stage, 0.0)
        usd_cached = usd - shared / 1e6 * (price.input_per_mtok - price.cached_per_mtok)
    concurrency = llm.actors * llm.max_in_flight
    hours = rows * means.seconds / concurrency / 3600 if means.seconds else None
    node_hours = fleet_usd = None
    if llm.fleet.node_hour_usd and hours is not None:
        node_hours = hours * llm.fleet.nodes
        fleet_usd = node_hours * llm.fleet.node_hour_usd
    return {
        "stage": stage,
        "rows": rows,
        "calls": round(rows * means.calls),
        "prompt_tokens": round(prompt),
        "completion_tokens": round(completion),
        "usd": None if usd is None else round(usd, 2),
        "usd_prefix_cached": None if usd_cached is None else round(usd_cached, 2),
        "prefix_share": PREFIX_SHARES.get(stage, 0.0),
        "hours": None if hours is None else round(hours, 2),
        "fleet_node_hours": None if node_hours is None else round(node_hours, 2),
        "fleet_usd": None if fleet_usd is None else round(fleet_usd, 2),
        "concurrency": concurrency,
        "model": model,
    }


def project_build(llm: LLMConfig, measured: dict[str, Measured], vol: Volumes) -> dict[str, Any]:
    """Every LLM stage of a build, and the totals against the build's spend cap."""
    stages = []
    for stage in BUILD_ORDER:
        means, source = per_row(stage, measured, vol.rates)
        stages.append({**project(stage, vol.rows[stage], means, llm), "means": source})
    usd = [s["usd"] for s in stages]
    cached = [s["usd_prefix_cached"] for s in stages]
    hours = [s["hours"] for s in stages if s["hours"] is not None]
    fleet = None
    if llm.fleet.node_hour_usd:
        charged = [s for s in stages if s["fleet_usd"] is not None]
        fleet = {
            "nodes": llm.fleet.nodes,
            "node_hour_usd": llm.fleet.node_hour_usd,
            "node_hours": round(sum(s["fleet_node_hours"] for s in charged), 2),
            "usd": round(sum(s["fleet_usd"] for s in charged), 2),
            "stages_without_hours": [s["stage"] for s in stages if s["fleet_usd"] is None],
        }
    return {
        "rows_source": vol.source,
        "pass_rates": {s: {"rate": v, "source": src} for s, (v, src) in vol.rates.items()},
        "concurrency": llm.actors * llm.max_in_flight,
        "hours_formula": HOURS_FORMULA,
        "prefix_source": PREFIX_SOURCE,
        "stages": stages,
        "total": {
            "calls": sum(s["calls"] for s in stages),
            "prompt_tokens": sum(s["prompt_tokens"] for s in stages),
            "completion_tokens": sum(s["completion_tokens"] for s in stages),
            "usd": None if None in usd else round(sum(usd), 2),
            "usd_prefix_cached": None if None in cached else round(sum(cached), 2),
            "hours_measured": round(sum(hours), 2),
        },
        "fleet": fleet,
        "max_usd": llm.max_usd,
    }


STORED_REPORT = "_judge_check/report.json"  # under a build root: what its watchers compare to


def store_report(cfg: Config, root: str, report: dict[str, Any]) -> str:
    """Keep a judge-check report measured for a build beside it (`--root`), where
    `cpr stats ROOT --watch` sets the spend so far against its projection."""
    storage = Storage(cfg.storage.model_copy(update={"root": root}))
    uri = join(root, STORED_REPORT)
    storage.write_json(uri, report)
    return uri
