"""What a running build has done so far, in files anyone who can read its root can follow.

Each stage keeps ``ROOT/_progress/STAGE.json`` while it runs: its run, when it started, its
state (running, done, failed), and for the step under way the rows done of the rows to do and
the LLM spend so far. `cpr stats ROOT --watch` reads these, the published manifests and the
root's owner lease: no Ray connection and no access to the driver, so a laptop with read access
to the bucket follows a cluster build. Writes are throttled (`MIN_INTERVAL_S`) so a stage of
10^5 rows leaves a few hundred small writes, not one per answer.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from cpr_ray.errors import StorageError
from cpr_ray.runs.side_services import side_failure
from cpr_ray.storage.store import Storage, join

FOLDER = "_progress"
MIN_INTERVAL_S = 5.0
State = Literal["running", "done", "failed"]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Progress:
    """One stage's progress as its file holds it; `step` names what the counts count (an LLM
    stage's current ask, e.g. "judge-analogy" or a tournament round)."""

    stage: str
    run_id: str
    state: State
    started: str
    updated: str
    step: str | None = None
    done: int = 0
    total: int | None = None
    usd: float = 0.0
    step_started: str | None = None

    def eta_s(self, now: dt.datetime | None = None) -> float | None:
        """Seconds left at the step's rate so far; None before there is a rate."""
        if self.state != "running" or not self.total or not self.done or not self.step_started:
            return None
        now = now or dt.datetime.now(dt.timezone.utc)
        elapsed = (now - dt.datetime.fromisoformat(self.step_started)).total_seconds()
        if elapsed <= 0:
            return None
        return max(0.0, (self.total - self.done) * elapsed / self.done)


def progress_uri(storage: Storage, stage: str) -> str:
    return join(storage.root, FOLDER, f"{stage}.json")


@dataclass
class ProgressWriter:
    """A stage's progress file, rewritten at most every `min_interval_s` (state changes and
    the last count of a step always)."""

    storage: Storage
    stage: str
    run_id: str
    min_interval_s: float = MIN_INTERVAL_S
    _now: Progress | None = field(default=None, init=False)
    _written_at: float = field(default=0.0, init=False)

    def start(self) -> None:
        now = _now()
        self._write(Progress(self.stage, self.run_id, "running", now, now), force=True)

    def step(self, name: str, done: int, total: int, usd: float = 0.0) -> None:
        """Counts of the step under way (a new `name` starts its clock)."""
        current = self._now or Progress(self.stage, self.run_id, "running", _now(), _now())
        started = current.step_started if current.step == name else _now()
        update = replace(current, step=name, done=done, total=total, usd=usd, step_started=started)
        self._write(update, force=done >= total or current.step != name)

    def finish(self, state: State) -> None:
        if self._now is not None:
            self._write(replace(self._now, state=state), force=True)

    def _write(self, progress: Progress, force: bool = False) -> None:
        progress = replace(progress, updated=_now())
        self._now = progress
        if not force and time.monotonic() - self._written_at < self.min_interval_s:
            return
        uri = progress_uri(self.storage, self.stage)
        try:
            self.storage.write_json(uri, asdict(progress))
            self._written_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - progress is for watching, never stops a stage
            side_failure(
                "progress",
                f"writing {uri}",
                exc,
                "`cpr stats --watch` will not follow this run; it goes on",
            )


def read_progress(storage: Storage) -> dict[str, Progress]:
    """Every stage's last progress file under the root, by stage."""
    out: dict[str, Progress] = {}
    is_s3 = storage.resolve(storage.root).is_s3
    for info in storage.list_files(join(storage.root, FOLDER), (".json",), missing_ok=True):
        try:
            raw: dict[str, Any] = storage.read_json(f"s3://{info.path}" if is_s3 else info.path)
            progress = Progress(**raw)
        except (StorageError, TypeError, ValueError):
            continue  # removed meanwhile, or not a progress file
        out[progress.stage] = progress
    return out
