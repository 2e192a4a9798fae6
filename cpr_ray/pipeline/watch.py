"""`cpr stats ROOT --watch`: a build followed from its root alone.

What a stage has published (its manifest), what it writes as it goes (`progress`), the root's
owner lease (a build or refresh holds it while it runs) and, when `cpr judge-check --root ROOT`
stored one, the projection of the build's LLM spend. Nothing here talks to Ray or the driver.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table

from cpr_ray.errors import StorageError
from cpr_ray.judge_check.projection import STORED_REPORT
from cpr_ray.runs.progress import Progress, read_progress
from cpr_ray.runs.stage_runner import Manifest, read_manifest
from cpr_ray.stages import STAGES
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, join


@dataclass(frozen=True)
class Snapshot:
    """One look at a root: each stage's manifest and progress, the owner, the projection."""

    manifests: dict[str, Manifest]
    progress: dict[str, Progress]
    owner: leases.Lease | None
    projected_usd: float | None

    @property
    def running(self) -> bool:
        return self.owner is not None

    def spent_usd(self) -> float:
        """LLM spend so far: published stages' figures, and the running stage's own."""
        total = 0.0
        for stage, manifest in self.manifests.items():
            p = self.progress.get(stage)
            if p is not None and p.state == "running" and p.run_id != manifest["run_id"]:
                continue  # rerunning: its progress counts below
            total += float(manifest.get("stats", {}).get("cost_usd") or 0.0)
        for stage, p in self.progress.items():
            published = self.manifests.get(stage)
            if p.state == "running" and (published is None or published["run_id"] != p.run_id):
                total += p.usd
        return total


def snapshot(storage: Storage, stages: Sequence[str] = STAGES) -> Snapshot:
    """The root now: the registered stages' manifests, every progress file, the owner."""
    manifests = {n: m for n in stages if (m := read_manifest(storage, n)) is not None}
    projected = None
    try:
        report = storage.read_json(join(storage.root, STORED_REPORT))
        projected = report["projection"]["total"]["usd"]
    except (FileNotFoundError, KeyError, TypeError, StorageError):
        pass
    return Snapshot(manifests, read_progress(storage), leases.current_owner(storage), projected)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return str(dt.timedelta(seconds=round(seconds)))


def watch_table(snap: Snapshot, stages: Sequence[str] = STAGES) -> Table:
    """One row a stage, in build order: its state, the step under way, rows done of rows to
    do, ETA, spend."""
    who = f"{snap.owner.purpose} {snap.owner.id} on {snap.owner.host}" if snap.owner else None
    title = f"running: {who}" if who else "no build or refresh is running"
    table = Table(title=title, title_justify="left")
    for col in ("stage", "state", "step", "rows", "ETA", "LLM $"):
        table.add_column(col, justify="right" if col in ("rows", "ETA", "LLM $") else "left")
    for stage in stages:
        p, m = snap.progress.get(stage), snap.manifests.get(stage)
        if p is not None and (m is None or p.run_id != m["run_id"]):
            state = p.state if snap.running or p.state != "running" else "stopped"
            rows = f"{p.done:,}/{p.total:,}" if p.total is not None else ""
            table.add_row(stage, state, p.step or "", rows, _duration(p.eta_s()), f"{p.usd:,.2f}")
        elif m is not None:
            cost = m.get("stats", {}).get("cost_usd")
            published = sum(t.get("rows", 0) for t in m.get("tables", {}).values())
            usd = "" if cost is None else f"{cost:,.2f}"
            table.add_row(stage, "done", m["run_id"], f"{published:,}", "", usd)
        else:
            table.add_row(stage, "pending" if snap.running else "", "", "", "", "")
    return table


def spend_line(snap: Snapshot) -> str:
    line = f"LLM spend so far ${snap.spent_usd():,.2f}"
    if snap.projected_usd is not None:
        line += f" of ${snap.projected_usd:,.2f} projected by cpr judge-check"
    return line
