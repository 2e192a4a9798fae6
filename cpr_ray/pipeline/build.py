"""The run over the registry's stages (`cpr_ray.stages`) in build order, so the CLI, the jobs,
the refresh and the dry run run the same thing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

from rich.table import Table

from cpr_ray import stages as registry
from cpr_ray.config import Config
from cpr_ray.corpus.inputs import discover_inputs
from cpr_ray.errors import StorageError
from cpr_ray.llm.answers import check_pins
from cpr_ray.runs import failures
from cpr_ray.runs.ray_runtime import user_errors_from_ray
from cpr_ray.runs.stage_runner import Manifest, entry
from cpr_ray.stages import INGEST, JUDGE_TRANSFER
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage

StageFn = Callable[..., Manifest]

# each registered stage's entry point, in build order (a benchmark wraps them to time each)
STAGES: dict[str, StageFn] = {name: entry(name) for name in registry.STAGES}
# the named stages in build order, all when none are named; an unknown name is refused
resolve_stages = registry.select


def check_root(storage: Storage) -> None:
    """The build root can be used: on S3 a listing of its prefix answers (where the HeadBucket
    this was needs the whole bucket) and a marker can be written there and removed (a role may
    list the bucket, so only a write tells a prefix it may not write); locally it is not a
    file.

    One line naming the prefix or the bucket, in seconds; found by the first write inside Ray it
    cost a minute and a multipart-upload traceback.
    """
    root = storage.resolve(storage.root)
    if root.is_s3:
        try:
            storage.check_prefix(root.uri)
            storage.check_writable(root.uri)
        except StorageError as exc:
            raise StorageError(f"storage.root {root.uri}: {exc}") from None
    elif storage.is_file(root.uri):
        raise StorageError(f"storage.root {root.uri} is a file; give a folder")


def preflight(cfg: Config, storage: Storage, selected: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Check what needs no Ray — the storage root, the LLM stages' pins, a second model for the
    transfer verification, and the input shards when ingest runs — so a bad path, bucket, pin or
    verifier fails in seconds, not after Ray's start. Returns
    per-stage arguments (the shards found, so ingest reads exactly what was checked)."""
    check_root(storage)
    registry.load_all()  # every stage's answer models, which the pins name
    check_pins(cfg.llm)
    if JUDGE_TRANSFER in selected:
        cfg.llm.check_verifier()
    if INGEST not in selected:
        return {}
    return {INGEST: {"inputs": discover_inputs(cfg, storage)}}


def run_build(
    cfg: Config,
    stages: Sequence[str] | None = None,
    *,
    force: bool = False,
    owner: leases.Owner | None = None,
) -> dict[str, Manifest]:
    """Run the selected stages in build order; returns each stage's manifest.

    The build owns the root while it runs (`owner`: the lease its caller, a refresh, holds
    already): a root another build or refresh owns stops it before Ray starts, in one line
    (`leases.RootBusy`). Ray starts with the first stage that runs (`run_stage`): a rerun that
    skips every stage starts none. A mistake a user made that surfaces inside Ray (a corrupt
    shard, a refusing endpoint) leaves each stage as its one-line `UserError`, with the Ray
    traceback in a log file it names; any failure of a stage is recorded under ``ROOT/_logs/``
    (`failures`).
    """
    cfg.require("storage.root", "input")  # evaluation-only configs carry neither
    storage = Storage(cfg.storage)
    selected = resolve_stages(stages)
    stage_args = preflight(cfg, storage, selected)
    secrets = failures.secret_names(cfg)
    manifests: dict[str, Manifest] = {}
    with leases.owner(storage, "build") if owner is None else nullcontext(owner):
        for name in selected:
            with failures.recorded(storage, name, secrets), user_errors_from_ray():
                manifests[name] = STAGES[name](
                    cfg, storage, force=force, **stage_args.get(name, {})
                )
    return manifests


def manifests_table(manifests: dict[str, Manifest]) -> Table:
    """What each stage published: its run, seconds, tables, rows and where they went."""
    table = Table(title="stages", title_justify="left")
    for col in ("stage", "run", "seconds", "table", "rows", "uri"):
        table.add_column(col)
    for name, m in manifests.items():
        for tname, t in m.get("tables", {}).items():
            table.add_row(
                name, m["run_id"], str(m.get("seconds", "")), tname, f"{t['rows']:,}", t["uri"]
            )
    return table
