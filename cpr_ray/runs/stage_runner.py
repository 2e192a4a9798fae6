"""Publishing stage outputs so that a build can be resumed and never does work twice.

A stage writes into a fresh run folder ``{root}/{stage}/runs/{run_id}/`` that nothing reads yet,
then publishes ``{root}/{stage}/_MANIFEST.json`` last. Object stores have no atomic rename, so
the manifest *is* the commit: readers follow it to the run folder, a crash before it leaves only
an orphan folder, and a stage whose manifest records the same inputs and config is skipped.

Stages are declared in the registry (`cpr_ray.stages`); `run_registered` runs one from its entry
there: the manifests of the stages it reads are its inputs and its body's arguments.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from rich.console import Console
from typing_extensions import Required, TypedDict  # pydantic reads only these on 3.11

from cpr_ray import __version__, stages
from cpr_ray.config import Config, LLMConfig
from cpr_ray.runs import prometheus as metrics
from cpr_ray.runs.progress import ProgressWriter
from cpr_ray.storage import leases
from cpr_ray.storage.s3_retries import storage_retries
from cpr_ray.storage.store import Storage, StorageError, join
from cpr_ray.tables import compaction

MANIFEST = "_MANIFEST.json"
console = Console(stderr=True)


@with_config(ConfigDict(extra="allow"))  # fields of a newer version read too
class TableRecord(TypedDict, total=False):
    """One table a stage published: where, in which format, how many rows; a Lance table also
    the version readers pin and its key-bucket layout."""

    uri: Required[str]
    format: str
    rows: int
    version: int | None
    layout: dict[str, Any]


@with_config(ConfigDict(extra="allow"))
class Manifest(TypedDict, total=False):
    """A stage's published manifest, ``{root}/{stage}/_MANIFEST.json``: the commit of its run.

    A typed record over the JSON object itself, so what is read is what was written, byte for
    byte (`read_manifest` checks the type of every field present; `write_manifest` writes it).
    `run_stage` writes every field; a reader needs only those it reads, so a manifest written
    by hand (a test's upstream, an index's source) reads too. `inputs` are what a rerun
    compares to skip; `lease` the root's lease generation it was published under; `corpus`
    and `refreshed` (ingest's alone) the S2 releases a refresh applied, and when."""

    stage: str
    run_id: str
    output: str
    tables: dict[str, TableRecord]
    stats: dict[str, Any]
    complete: bool
    inputs: dict[str, Any]
    config_hash: str
    code_version: str
    started: str
    seconds: float
    storage_retries: int
    lease: dict[str, Any] | None
    corpus: dict[str, Any]
    refreshed: str


_MANIFEST = TypeAdapter(Manifest)
# the published manifests of the stages a stage reads, by stage
Reads = Mapping[str, Manifest]


@dataclass
class StageOutput:
    """What a stage function returns: its tables and statistics."""

    tables: dict[str, TableRecord] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    # False when some rows are missing for a reason a rerun may fix (an LLM call that failed in
    # transport): published so the build can go on, but never skipped as final by a rerun
    complete: bool = True


class Phases:
    """Wall seconds per phase of a stage, for its statistics (where the time goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lap = time.perf_counter()

    def lap(self, name: str) -> None:
        """The time since the previous lap (or since the start) is phase `name`: for a stage
        written as one sequence of steps."""
        now = time.perf_counter()
        self.seconds[name] = round(now - self._lap, 2)
        self._lap = now

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 2)


@dataclass(frozen=True)
class StageRun:
    name: str
    run_id: str
    out: str  # the run folder: write here, nowhere else
    cfg: Config
    storage: Storage
    progress: ProgressWriter | None = None  # what `cpr stats --watch` reads as it runs
    # folders of small parts its LLM asks appended to (cache, ledger): compacted before it
    # publishes (`compaction`)
    part_folders: set[str] = field(default_factory=set, compare=False)

    @property
    def llm(self) -> LLMConfig:
        return self.cfg.llm


@cache
def code_version() -> str:
    """Package version plus the git commit when running from a checkout (recorded, not compared)."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__


def manifest_uri(storage: Storage, stage: str) -> str:
    return join(storage.root, stage, MANIFEST)


def read_manifest(storage: Storage, stage: str) -> Manifest | None:
    """The stage's published manifest; None when there is none, or when it was written under a
    lease already taken over (`leases.superseded`): the stage runs again. One that is not a
    manifest (a hand edit, another program's file) stops with one line naming it."""
    uri = manifest_uri(storage, stage)
    try:
        raw = storage.read_json(uri)
    except FileNotFoundError:
        return None
    try:
        _MANIFEST.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise StorageError(f"{uri} is no stage manifest: {where}: {first['msg']}") from None
    manifest: Manifest = raw  # checked above; the object itself, so a rewrite keeps its bytes
    return None if leases.superseded(storage, dict(manifest), uri) else manifest


def write_manifest(storage: Storage, manifest: Manifest) -> None:
    """Publish `manifest` as its stage's commit (the one writer: the root's lease owner)."""
    storage.write_json(manifest_uri(storage, manifest["stage"]), dict(manifest))


def require_manifest(storage: Storage, stage: str) -> Manifest:
    """A stage's published manifest, for a stage that reads its tables.

    A Lance table the manifest records at a version (the corpus) must still be at it: a newer
    one is a refresh that stopped before its commit, and reading it would mix two releases.
    """
    manifest = read_manifest(storage, stage)
    if manifest is None:
        raise StorageError(
            f"stage {stage!r} has no published output under {storage.root}; run it first "
            f"(cpr build --stages {stage})"
        )
    for name, table in manifest["tables"].items():
        if table.get("format") == "lance" and table.get("version") is not None:
            found = storage.open_lance(table["uri"]).version
            if found != table["version"]:
                raise StorageError(
                    f"{stage} table {name} is at version {found}, but version "
                    f"{table['version']} is published: a refresh stopped before its commit; "
                    "run cpr refresh again to finish it"
                )
    return manifest


def run_registered(
    name: str, cfg: Config, storage: Storage, *, force: bool = False, **args: Any
) -> Manifest:
    """Run (or skip) the registered stage `name` (`cpr_ray.stages`): the published manifests of
    the stages it reads are handed to its body, and their runs are its inputs (or what its
    `prepare` computes from `args`, for a stage that reads no stage's output)."""
    declared = stages.stage(name)
    reads = {upstream: require_manifest(storage, upstream) for upstream in declared.reads}
    inputs: dict[str, Any] = {upstream: m["run_id"] for upstream, m in reads.items()}
    if declared.prepare is not None:
        inputs, args = stages.resolve(declared.prepare)(cfg, storage, force=force, **args)
    return run_stage(
        name,
        cfg,
        storage,
        inputs=inputs,
        config_sections=declared.config_sections,
        fn=partial(stages.resolve(declared.run), reads=reads, **args),
        force=force,
    )


def entry(name: str) -> Callable[..., Manifest]:
    """`run_registered` for one stage, as its module offers it: ``mine(cfg, storage)``."""
    return partial(run_registered, name)


def run_stage(
    name: str,
    cfg: Config,
    storage: Storage,
    inputs: dict[str, Any],
    config_sections: tuple[str, ...],
    fn: Callable[[StageRun], StageOutput],
    *,
    force: bool = False,
) -> Manifest:
    """Run `fn` unless a published manifest already matches `inputs` and the config sections.

    Ray starts (or is joined) here, for the first stage that runs: a rerun that finds every
    stage done skips them all without it (on 2 cores Ray's start and stop cost ~15 s).
    Returns the manifest (the existing one when skipped).
    """
    config_hash = cfg.section_hash(*config_sections)
    previous = read_manifest(storage, name)
    if previous is not None and not previous.get("complete", True) and not force:
        console.print(
            f"[bold]{name}[/]: run {previous['run_id']} was incomplete; running again (answers "
            "already paid for are reused)"
        )
    elif (
        previous is not None
        and not force
        and previous.get("inputs") == inputs
        and previous.get("config_hash") == config_hash
    ):
        console.print(
            f"[bold]{name}[/]: skipped, output of run {previous['run_id']} matches its inputs "
            "and config (use --force to rerun)"
        )
        return previous

    run_id = (
        dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
    )
    out = join(storage.root, name, "runs", run_id)
    started = time.time()
    console.print(f"[bold]{name}[/]: running (run {run_id}) → {out}")
    retries_before = storage_retries()
    progress = ProgressWriter(storage, name, run_id)
    progress.start()
    run = StageRun(name, run_id, out, cfg, storage, progress)
    try:
        from cpr_ray.runs.ray_runtime import ensure_ray

        ensure_ray(cfg.ray)
        result = fn(run)
        # before the publish: a stage stopped in a compaction is run again (its answers from
        # the cache), and that run finishes the compaction
        compaction.compact_folders(storage, run.part_folders)
    except BaseException:
        progress.finish("failed")
        raise
    seconds = round(time.time() - started, 2)
    retries = storage_retries() - retries_before
    manifest: Manifest = {
        "stage": name,
        "run_id": run_id,
        "output": out,
        "tables": result.tables,
        "stats": result.stats,
        "complete": result.complete,
        "inputs": inputs,
        "config_hash": config_hash,
        "code_version": code_version(),
        "started": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(),
        "seconds": seconds,
        "storage_retries": retries,
    }
    # a build whose lease was taken over, or not renewed within its slack, publishes nothing;
    # the manifest records the lease's generation renewed right now
    manifest["lease"] = leases.fence(storage)
    # one writer: only the root's lease owner publishes, so an unconditional write loses nothing
    write_manifest(storage, manifest)
    metrics.stage_published(name, result.tables)
    progress.finish("done")
    _remove_old_runs(storage, name, keep=run_id)
    # what the driver's storage calls retried (S3 throttling, resets: boto3's, Lance's 5xx and
    # Storage's own); the workers' and pyarrow's are not counted (cpr_ray/storage/s3_retries.py)
    console.print(f"[bold]{name}[/]: published in {seconds} s; storage retries: {retries}")
    return manifest


def published_runs(storage: Storage) -> set[str]:
    """Every folder a stage's manifest on the root points at (its run, its tables' URIs)."""
    out: set[str] = set()
    for stage_dir in storage.list_dirs(storage.root):
        try:
            manifest = storage.read_json(join(stage_dir, MANIFEST))
        except FileNotFoundError:
            continue
        tables = manifest.get("tables", {}).values()
        uris = [manifest.get("output"), *(t.get("uri") for t in tables)]
        out.update(storage.resolve(u).uri for u in uris if u)
    return out


def _remove_old_runs(storage: Storage, stage: str, keep: str) -> None:
    """Runs superseded by the published one (or orphaned by a crash) are garbage, unless
    something still points at them: a manifest of any stage, or a live reader's lease (a
    training run reading the export it replaced). Nothing goes while another process owns the
    root: any run folder may be one it is writing."""
    pinned = leases.pins(storage)
    if pinned is None:
        return
    pinned |= published_runs(storage)
    for run in storage.list_dirs(join(storage.root, stage, "runs")):
        if not run.rstrip("/").endswith(keep) and not leases.covers(pinned, run):
            storage.delete_dir(run)
