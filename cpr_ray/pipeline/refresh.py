"""The nightly refresh as a whole: the corpus brought to S2's latest release
(`corpus.refresh`), then the build's later stages rerun, paying only for what changed.

**Downstream.** The later stages rerun on the updated corpus and, with ``refresh.incremental``
(the default), compute only the rows the step reached, reusing what their last run kept: mining
re-reads the papers each commit recorded as changed (`corpus.corpus_changes`) and what they
cite, and redraws the base papers per field from the kept eligible keys; each LLM stage carries
the answered rows whose request inputs are unchanged and keys only the others against the cache
(the refresh's ledger rows are its new pairs only); the embedding store encodes only new or
changed texts, and a dense pooler keeps every query's lists that lost no paper, merged with the
added papers' own. What is recomputed in full every night, and why: the venues' ranks (two
columns), the per-field draw (a sort of the kept keys) and BM25 (its statistics change with any
added paper). Every such stage publishes what a full rerun (``refresh.incremental: false``)
publishes. Pairs of deleted or no longer eligible papers are simply not mined again, so the
next export retracts them. The dataset card lists the releases it covers.

**One owner at a time.** A refresh owns the root while it runs (`leases.owner`, taken with a
conditional write, so a build and a refresh started together cannot both get it). A refresh that
finds a build or another refresh owning the root, alive or not provably dead, does no work and
stops with exit code 75 and one line, "root owned by HOST since T; retry after T'" (T' is when
that lease goes stale unless renewed): a scheduler's retry or alert sees it, where an exit 0
would hide a refresh killed and retried into its own fresh lease night after night. A lease
held by this job's earlier attempt (the same `$CPR_JOB_ID`: a RayJob's name) is taken over at
once: that attempt was killed, or its scheduler would not have retried it. Old table versions
are removed after a refresh once older than ``refresh.retain_versions_days``, never while a
reader (an index of the root) is reading the corpus.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from cpr_ray.config import Config
from cpr_ray.corpus.apply_diffs import RefreshRun, apply_diffs, remove_old_versions
from cpr_ray.corpus.s2_api import S2DatasetsClient
from cpr_ray.llm.spend import counted_from_here
from cpr_ray.llm.spend_ledger import ledger_summary
from cpr_ray.pipeline.build import run_build
from cpr_ray.runs import failures
from cpr_ray.runs.ray_runtime import user_errors_from_ray
from cpr_ray.runs.stage_runner import console, read_manifest
from cpr_ray.stages import EXPORT, INGEST, STAGES
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, join

# what a refresh reruns once the corpus is brought up to date: every stage after ingest
DOWNSTREAM: tuple[str, ...] = tuple(s for s in STAGES if s != INGEST)


def refresh(cfg: Config, client: S2DatasetsClient | None = None) -> dict[str, Any]:
    """Apply S2's diffs since the last refresh and rerun what depends on the corpus."""
    run = RefreshRun.open(cfg, client)
    storage = run.storage
    with ExitStack() as stack:
        try:
            owner = stack.enter_context(leases.owner(storage, "refresh"))
        except leases.RootBusy as busy:
            raise leases.RootOwned(storage.root, busy.holder) from None
        ledger_before = _ledger_rows(storage)
        secrets = failures.secret_names(cfg)
        with failures.recorded(storage, "refresh", secrets), user_errors_from_ray():
            applied = apply_diffs(run)
        downstream: dict[str, Any] = {}
        if cfg.refresh.downstream:
            with counted_from_here(storage, cfg.llm):  # the caps count this night's spend
                manifests = run_build(cfg, DOWNSTREAM, owner=owner)
            downstream = {name: m["run_id"] for name, m in manifests.items()}
        readers = leases.readers(storage, join(storage.root, INGEST))
        cleaned: dict[str, int] | str = (
            f"skipped: {len(readers)} reader(s) hold a lease ({', '.join(r.id for r in readers)})"
            if readers
            else remove_old_versions(run, applied.corpus)
        )
        ledger_after = _ledger_rows(storage)
    summary = {
        "root": storage.root,
        "from_release": applied.start_release,
        "to_release": applied.state["release"],
        "steps": applied.reports,
        "restored": applied.restored,
        "openalex_snapshot": applied.state.get("openalex_snapshot"),
        "llm_rows": {s: ledger_after.get(s, 0) - ledger_before.get(s, 0) for s in ledger_after},
        "downstream": downstream,
        "versions_removed": cleaned,
        "export": (read_manifest(storage, EXPORT) or {}).get("output"),
    }
    _print_summary(summary)
    return summary


def _ledger_rows(storage: Storage) -> dict[str, int]:
    return {row["stage"]: row["rows"] for row in ledger_summary(storage)}


def _print_summary(summary: dict[str, Any]) -> None:
    llm = ", ".join(f"{s} {n:,}" for s, n in summary["llm_rows"].items() if n) or "none"
    console.print(
        f"[bold]refresh[/]: S2 {summary['from_release']} → {summary['to_release']} in "
        f"{sum(s['source'] == 's2' for s in summary['steps'])} release step(s); topics from "
        f"{summary['openalex_snapshot']}; "
        f"new LLM answers: {llm}; old versions: {summary['versions_removed']}"
        + (f"; export {summary['export']}" if summary["export"] else "")
    )


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What the CLI and the job print last: where things went, what it cost."""
    s2_steps = [s for s in summary["steps"] if s["source"] == "s2"]
    lines = [
        f"corpus: S2 {summary['from_release']} → {summary['to_release']}, "
        f"{len(s2_steps)} release step(s) applied; topics from {summary['openalex_snapshot']}"
    ]
    for step in summary["steps"]:
        ch = ", ".join(
            f"{name} +{c['inserted']:,} ~{c['updated']:,} -{c['deleted']:,}"
            for name, c in step["changes"].items()
        )
        lines.append(f"  {step['step']}: {ch}")
    asked = {s: n for s, n in summary["llm_rows"].items() if n}
    lines.append(
        "new LLM answers: "
        + (", ".join(f"{s} {n:,}" for s, n in asked.items()) if asked else "none")
        + f" (ledger: cpr stats {summary['root']})"
    )
    if summary["export"]:
        lines.append(f"export: {summary['export']}")
    lines.append(f"old table versions removed: {summary['versions_removed']}")
    return lines
