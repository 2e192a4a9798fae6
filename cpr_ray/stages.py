"""Every stage of the build, declared once: what it is called, which stages' published output it
reads, which config sections decide its output, what it asks Ray for, and the LLM tasks it asks
(with the gold set `cpr judge-check` measures each against).

The build, the refresh, the dry run, `cpr judge-check`, `cpr stats --watch` and the config's
`llm.stages.*` keys all read this table; nothing else spells a stage's name. Adding a stage is
one entry here, its module and its test.

Code is named the way entry points name it, ``"package.module:attribute"``, and imported only
when asked for (`resolve`): so this table sits below everything it describes (the config checks
its keys against it, the runner and the stage modules import it) and imports none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cpr_ray.errors import ConfigError

# the stages, in build order
INGEST = "ingest"
VENUES = "venues"
MINE = "mine"
JUDGE_ANALOGY = "judge-analogy"
JUDGE_TRANSFER = "judge-transfer"
WRITE_QUERIES = "write-queries"
DEDUP = "dedup"
SCORE_POSITIVES = "score-positives"
POOL = "pool"
JUDGE_NEGATIVES = "judge-negatives"
EXPORT = "export"
SYNTHESIZE_QUERIES = "synthesize-queries"
# dedup's second task (the strongest analogy of a group): a gold set of its own, not a stage
STRONGEST = "strongest"


@dataclass(frozen=True)
class Resources:
    """What a stage asks Ray for, and the config keys that size it (the figures live there)."""

    kind: Literal["driver", "cpu-tasks", "llm-actors", "encoder-actors"]
    keys: tuple[str, ...] = ()


DRIVER = Resources("driver")  # small tables, read and written by the driver alone
CPU_TASKS = Resources("cpu-tasks", ("ingest.cpus_per_task",))  # one Ray task per key bucket
LLM_ACTORS = Resources("llm-actors", ("llm.actors", "llm.max_in_flight", "llm.inline_max_rows"))


@dataclass(frozen=True)
class Task:
    """One LLM task a stage asks: `cls` names its `LLMTask`; `gold` the gold set
    (``judge_check/gold/{gold}.jsonl``) that `cpr judge-check` measures it against, where it
    has one. The task's `gold_label` turns one of its answers into the gold's label."""

    cls: str
    gold: str | None = None


@dataclass(frozen=True)
class Stage:
    """One stage. `run` names its body, ``(StageRun, reads) -> StageOutput``, where `reads`
    holds the published manifests of the stages in `reads`; their run ids are the stage's
    inputs (a rerun whose inputs and config sections match is skipped). `prepare`, where set,
    names a function that computes the inputs instead (ingest: the shards' fingerprints)."""

    name: str
    run: str
    reads: tuple[str, ...] = ()
    config_sections: tuple[str, ...] = ()
    resources: Resources = DRIVER
    tasks: tuple[Task, ...] = ()
    prepare: str | None = None

    @property
    def asks_llm(self) -> bool:
        """An LLM stage: `llm.stages.NAME` configures it and the spend caps cover it."""
        return bool(self.tasks)


_QUERIES = "cpr_ray.queries.positive_stages"

REGISTRY: tuple[Stage, ...] = (
    Stage(
        INGEST,
        "cpr_ray.corpus.ingest:run_ingest",
        config_sections=("input", "ingest"),
        resources=CPU_TASKS,
        prepare="cpr_ray.corpus.ingest:prepare_ingest",
    ),
    Stage(VENUES, "cpr_ray.mining.mining_stages:run_venues", (INGEST,), ("mining",)),
    Stage(MINE, "cpr_ray.mining.mining_stages:run_mine", (INGEST, VENUES), ("mining",), CPU_TASKS),
    Stage(
        JUDGE_ANALOGY,
        f"{_QUERIES}:run_judge_analogy",
        (MINE, INGEST),
        ("llm",),
        LLM_ACTORS,
        (Task("cpr_ray.queries.judges:AnalogyJudge", JUDGE_ANALOGY),),
    ),
    Stage(
        JUDGE_TRANSFER,
        f"{_QUERIES}:run_judge_transfer",
        (JUDGE_ANALOGY,),
        ("llm",),
        LLM_ACTORS,
        (Task("cpr_ray.queries.judges:TransferVerifier", JUDGE_TRANSFER),),
    ),
    Stage(
        WRITE_QUERIES,
        f"{_QUERIES}:run_write_queries",
        (JUDGE_TRANSFER,),
        ("llm",),
        LLM_ACTORS,
        (
            Task("cpr_ray.queries.writing:QueryWriter"),
            # judge-check measures the writer's review step alone: its accept/reject is a
            # judgment; the problem and the query it writes are text no gold label can score
            Task("cpr_ray.judge_check.tasks:QueryReviewStep", WRITE_QUERIES),
        ),
    ),
    Stage(
        DEDUP,
        f"{_QUERIES}:run_dedup",
        (WRITE_QUERIES,),
        ("llm",),
        LLM_ACTORS,
        (
            Task("cpr_ray.queries.dedup:SameProblemJudge", DEDUP),
            Task("cpr_ray.queries.dedup:StrongestAnalogyJudge", STRONGEST),
        ),
    ),
    Stage(
        SCORE_POSITIVES,
        f"{_QUERIES}:run_score_positives",
        (DEDUP,),
        ("llm",),
        LLM_ACTORS,
        (Task("cpr_ray.queries.usefulness:UsefulnessGrader", SCORE_POSITIVES),),
    ),
    Stage(
        POOL,
        "cpr_ray.pooling.pool_stage:run_pool",
        (SCORE_POSITIVES, JUDGE_ANALOGY, MINE, INGEST),
        ("pooling",),
        Resources(
            "encoder-actors",
            (
                "pooling.poolers.encoder.actors",
                "pooling.poolers.encoder.gpus_per_actor",
                "pooling.search_actors",
            ),
        ),
    ),
    Stage(
        JUDGE_NEGATIVES,
        "cpr_ray.dataset.negatives:run_judge_negatives",
        (POOL, INGEST),
        ("llm", "dataset"),
        LLM_ACTORS,
        (Task("cpr_ray.dataset.negatives:NegativeGrader", JUDGE_NEGATIVES),),
    ),
    Stage(
        EXPORT, "cpr_ray.dataset.export:run_export", (POOL, JUDGE_NEGATIVES, INGEST), ("dataset",)
    ),
    Stage(
        SYNTHESIZE_QUERIES,
        "cpr_ray.queries.synthesis:run_synthesis",
        (EXPORT, INGEST),
        ("llm", "synthesis"),
        LLM_ACTORS,
        (Task("cpr_ray.queries.synthesis:QuerySynthesizer"),),
    ),
)


def build_order(registry: Iterable[Stage] = REGISTRY) -> tuple[str, ...]:
    """The stages in an order where each comes after every stage it reads: declaration order
    where that allows (a stable topological sort), so a new stage lands where it was declared
    unless what it reads comes later. A read of an undeclared stage, or a cycle, is refused."""
    stages = list(registry)
    names = {s.name for s in stages}
    for s in stages:
        missing = [r for r in s.reads if r not in names]
        if missing:
            raise ConfigError(f"stage {s.name} reads {', '.join(missing)}, which is no stage")
    order: list[str] = []
    while len(order) < len(stages):
        ready = next(
            (s for s in stages if s.name not in order and set(s.reads) <= set(order)), None
        )
        if ready is None:
            left = [s.name for s in stages if s.name not in order]
            raise ConfigError(f"stages {', '.join(left)} read each other in a cycle")
        order.append(ready.name)
    return tuple(order)


STAGES: tuple[str, ...] = build_order()
_BY_NAME = {s.name: s for s in REGISTRY}
# the LLM stages of a build, in build order: `llm.stages.*` keys and the spend caps cover these
LLM_STAGES: tuple[str, ...] = tuple(n for n in STAGES if _BY_NAME[n].asks_llm)
# every gold set `cpr judge-check` measures, in build order: the task measured, and its stage
GOLD: dict[str, Task] = {t.gold: t for n in STAGES for t in _BY_NAME[n].tasks if t.gold}
GOLD_STAGE: dict[str, str] = {t.gold: n for n in STAGES for t in _BY_NAME[n].tasks if t.gold}


def stage(name: str) -> Stage:
    """The registered stage called `name`."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(f"unknown stage {name}; known: {', '.join(STAGES)}") from None


def select(names: Sequence[str] | None) -> list[str]:
    """The named stages (all when none are named) in build order; an unknown name is refused."""
    if not names:
        return list(STAGES)
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    return [n for n in STAGES if n in names]


def upstream(name: str, registry: Iterable[Stage] = REGISTRY) -> tuple[str, ...]:
    """Every stage `name` reads, directly or through others, in build order."""
    by_name = {s.name: s for s in registry}
    seen: set[str] = set()
    todo = list(by_name[name].reads)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(by_name[n].reads)
    return tuple(n for n in build_order(by_name.values()) if n in seen)


def load_all(registry: Iterable[Stage] = REGISTRY) -> None:
    """Import every stage's code: what a check over all of it needs loaded first (a pin is
    checked against the answer models the stage modules define)."""
    for s in registry:
        resolve(s.run)
        for t in s.tasks:
            resolve(t.cls)


def resolve(ref: str) -> Any:
    """The object a ``"package.module:attribute"`` reference names (imported now)."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)
