"""What each commit of the refresh changed in the corpus tables, for the later stages to redo
only what a diff reaches.

Every commit of `apply_diffs` (an S2 release step, a new OpenAlex partition's relink) writes a
record of the ids its bucket tasks changed: each task that edited papers or citations buckets
writes one small Parquet file of ``(id, kind)`` rows under the ingest run's ``changes/`` folder
(kind ``paper``: a paper inserted or whose published row differs in any column; ``deleted``: a
paper deleted; ``citing``: a citing id whose citation rows were inserted, changed or deleted,
including those deleted because their cited paper was), so no id passes through the driver.
The step's history entry in the ingest manifest (``corpus.applied``) names the folder, how many
files it holds, and the ``run_id`` the commit published.

A row rewritten identically (a relinked paper whose OpenAlex work changed nothing the corpus
keeps, a citation record repeated as it was) is not a change: nothing downstream can differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import StorageError
from cpr_ray.runs.stage_runner import Manifest
from cpr_ray.storage.store import Storage

PAPER, DELETED, CITING = "paper", "deleted", "citing"
RECORD = pa.schema([("id", pa.int64()), ("kind", pa.string())])
RECORD_KEY = "changed_ids"  # the history entry's {"uri": folder, "files": n}


@dataclass(frozen=True)
class CorpusChanges:
    """Corpus ids a span of commits changed (each array sorted, no repeats)."""

    papers: pa.Array  # int64 corpus ids inserted, updated (any column) or deleted
    deleted_papers: pa.Array  # int64 corpus ids deleted (a subset of papers)
    citing: pa.Array  # int64 citing ids whose citation rows were inserted/updated/deleted


def record_rows(ids: pa.Array | pa.ChunkedArray, kind: str) -> pa.Table:
    """`ids` as rows of a change record of one kind."""
    flat = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    flat = flat.cast(pa.int64()).unique()
    return pa.table({"id": flat, "kind": pa.array([kind] * len(flat), pa.string())}, RECORD)


def changes_between(storage: Storage, ingest: Manifest, since_run_id: str) -> CorpusChanges | None:
    """Union of what every commit after `since_run_id` (an ingest run_id a stage recorded as
    its input) changed, up to the manifest's current run; None when unknown (since_run_id
    not in the manifest's history, a step without a record, a record missing files or
    unreadable): the caller runs in full."""
    entries = _entries_after(ingest, since_run_id)
    if entries is None:
        return None
    parts = [RECORD.empty_table()]
    for entry in entries:
        found = _read_record(storage, entry.get(RECORD_KEY))
        if found is None:
            return None
        parts.append(found)
    rows = pa.concat_tables(parts)

    def of(kinds: Sequence[str]) -> pa.Array:
        picked = rows.filter(pc.is_in(rows["kind"], pa.array(kinds)))["id"]
        unique = picked.combine_chunks().unique()
        return unique.take(pc.array_sort_indices(unique))

    return CorpusChanges(of([PAPER, DELETED]), of([DELETED]), of([CITING]))


def _entries_after(ingest: Manifest, since_run_id: str) -> list[dict[str, Any]] | None:
    state = ingest.get("corpus") or {}
    applied: list[dict[str, Any]] = state.get("applied") or []
    if since_run_id == ingest.get("run_id"):
        return []
    if since_run_id == state.get("ingest_run_id"):
        return applied
    run_ids = [entry.get("run_id") for entry in applied]
    if since_run_id not in run_ids:
        return None
    # the last entry with that run id: a commit that changed nothing keeps the run id
    last = len(run_ids) - 1 - run_ids[::-1].index(since_run_id)
    return applied[last + 1 :]


def _read_record(storage: Storage, record: dict[str, Any] | None) -> pa.Table | None:
    """A step's record, or None when it has none or lacks a file it was written with."""
    if not record:
        return None
    if not record["files"]:
        return RECORD.empty_table()
    try:
        files = [f for f in storage.list_folder(record["uri"]) if f.path.endswith(".parquet")]
        if len(files) != record["files"]:
            return None
        return pa.concat_tables(
            storage.read_parquet(f"{record['uri'].rstrip('/')}/{f.base_name}").cast(RECORD)
            for f in files
        )
    except (StorageError, pa.ArrowInvalid, OSError):
        return None
