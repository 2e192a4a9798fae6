"""Folders of small Parquet parts: read as one table, and compacted into a few large parts.

The LLM cache and ledger (`llm.ledger`) are folders that many writers append to at once, each
asker a small part every `FLUSH_S`: a big stage leaves 10^4-10^5 objects, and every later read
would list and open them all, night after night. So after a stage that appended to them, the
root's owner (its build or refresh, one at a time: `leases`) rewrites the small parts as a few
compacted parts of up to `TARGET_BYTES` of input each, and removes them. The rows stay the same
rows, in the same order; only the files change.

An object store has no atomic rename, so each compacted part is made in steps a reader can see:

1. a plan, ``_compacting-ID.json``: the part to come and every part it covers;
2. the part, ``compacted-SEQ-ID.parquet``, written whole or not at all: the commit;
3. the covered parts removed, then the plan.

A reader lists the folder once (`list_parts`). With no plan in it, the normal case, every
Parquet file there is live. Otherwise it reads the plans, and a plan whose part is in the
listing hides the parts it covers: each row counts once, whether a compaction stopped before
its part, between its part and its removals, or among them. A plan whose part is absent never
committed and hides nothing. The next compaction finishes (or drops) such plans first.
Compacted parts are read first, by sequence, then the small parts by name: the order in which
their rows were written, as before, so `first_per_key` serves the same answer.
"""

from __future__ import annotations

import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.fs as pafs
from rich.console import Console

from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, join

COMPACTED = re.compile(r"^compacted-(?P<seq>\d{6})-[0-9a-f]{8}\.parquet$")
PLAN_PREFIX = "_compacting-"
TARGET_BYTES = 64 * 1024**2  # of input parts per compacted part: one in memory at a time
READ_THREADS = 16  # small parts read at once while compacting (each a round trip on S3)
READ_TRIES = 3  # a part may be removed between a reader's listing and its read: list again
VANISHED = re.compile(r"NO_SUCH_KEY|NoSuchKey|RESOURCE_NOT_FOUND")

console = Console(stderr=True)


@dataclass(frozen=True)
class Compacted:
    """What one compaction of a folder did."""

    folder: str
    parts: int  # parts rewritten (the small ones, and the last compacted one if it had room)
    into: int  # compacted parts written
    finished: int  # plans of an earlier, stopped compaction finished or dropped


def list_parts(storage: Storage, folder: str) -> list[pafs.FileInfo]:
    """The folder's live parts in reading order: one listing, and the plans only if any."""
    entries = storage.list_folder(folder)
    present = {e.base_name for e in entries}
    hidden: set[str] = set()
    for plan in _plans(entries):
        found = _read_plan(storage, join(folder, plan.base_name))
        if found is not None and found["part"] in present:
            hidden.update(found["covers"])
    live = [e for e in entries if _is_part(e) and e.base_name not in hidden]
    return sorted(live, key=lambda e: (COMPACTED.match(e.base_name) is None, e.base_name))


def read_parts(
    storage: Storage,
    folder: str,
    schema: pa.Schema,
    *,
    columns: list[str] | None = None,
    filter: pds.Expression | None = None,
) -> pa.Table:
    """Every live row of the folder as `schema` (a column a part lacks reads as null).

    The parts are opened at the sizes the listing gave (no request per part to ask it). A part
    removed between the listing and the read (a compaction finishing while `cpr stats` reads)
    is a reason to list again, not an error."""
    for _ in range(READ_TRIES - 1):
        try:
            return _read_once(storage, folder, schema, columns, filter)
        except OSError as exc:
            if not _vanished(exc):
                raise
    return _read_once(storage, folder, schema, columns, filter)


def compact(storage: Storage, folder: str) -> Compacted | None:
    """Rewrite the folder's small parts as compacted ones; None when this thread does not own
    the root (only the owner compacts: two compactions of one folder at once would each write
    the same rows). Parts written while it runs are left for the next one."""
    owner = leases.held(storage)
    if owner is None:
        return None
    entries = storage.list_folder(folder)
    finished = _finish(storage, folder, entries, owner)
    if finished:
        entries = storage.list_folder(folder)
    parts = [e for e in entries if _is_part(e)]
    compacted = [p for p in parts if COMPACTED.match(p.base_name)]
    small = [p for p in parts if not COMPACTED.match(p.base_name)]
    if not small:
        return Compacted(folder, 0, 0, finished)
    inputs, seq = small, 0
    if compacted:  # the last one, if it has room, takes the new rows (and keeps its place)
        last = compacted[-1]
        seq = int(COMPACTED.match(last.base_name)["seq"])  # type: ignore[index]
        if last.size < TARGET_BYTES:
            inputs = [last, *small]
        else:
            seq += 1
    groups = _groups(inputs)
    for i, group in enumerate(groups):
        _rewrite(storage, folder, group, seq + i, owner)
    return Compacted(folder, len(inputs), len(groups), finished)


def compact_folders(storage: Storage, folders: set[str]) -> list[Compacted]:
    """`compact` each folder, one line for each that had small parts."""
    done = []
    for folder in sorted(folders):
        result = compact(storage, folder)
        if result is None:
            continue
        done.append(result)
        if result.parts:
            console.print(f"  compacted {result.parts:,} parts of {folder} into {result.into:,}")
    return done


def _read_once(
    storage: Storage,
    folder: str,
    schema: pa.Schema,
    columns: list[str] | None,
    filter: pds.Expression | None,
) -> pa.Table:
    loc = storage.resolve(folder)
    fmt = pds.ParquetFileFormat()
    fragments = [
        fmt.make_fragment(p.path, loc.fs, file_size=p.size) for p in list_parts(storage, folder)
    ]
    dataset = pds.FileSystemDataset(fragments, schema, fmt, loc.fs)
    return dataset.to_table(columns=columns, filter=filter)


def _vanished(exc: OSError) -> bool:
    """A part gone since the listing: FileNotFoundError locally, the AWS SDK's not-found on S3."""
    return isinstance(exc, FileNotFoundError) or bool(VANISHED.search(str(exc)))


def _is_part(info: pafs.FileInfo) -> bool:
    return info.base_name.endswith(".parquet") and not info.base_name.startswith((".", "_"))


def _plans(entries: list[pafs.FileInfo]) -> list[pafs.FileInfo]:
    return [
        e for e in entries if e.base_name.startswith(PLAN_PREFIX) and e.base_name.endswith(".json")
    ]


def _read_plan(storage: Storage, uri: str) -> dict[str, Any] | None:
    """A plan, or None when it is gone (its compaction finished) or not yet whole (its part,
    written after it, does not exist yet)."""
    try:
        plan = storage.read_json(uri)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return plan if isinstance(plan, dict) and "part" in plan and "covers" in plan else None


def _finish(
    storage: Storage, folder: str, entries: list[pafs.FileInfo], owner: leases.Owner
) -> int:
    """Finish the plans a stopped compaction left: a committed one's covered parts go, then
    the plan; a plan that never committed just goes."""
    present = {e.base_name for e in entries}
    plans = _plans(entries)
    for plan in plans:
        uri = join(folder, plan.base_name)
        found = _read_plan(storage, uri)
        owner.check()
        if found is not None and found["part"] in present:
            covered = [c for c in found["covers"] if c in present]
            storage.delete_files([join(folder, c) for c in covered])
        storage.delete_file(uri)
    return len(plans)


def _groups(parts: list[pafs.FileInfo]) -> list[list[pafs.FileInfo]]:
    """Consecutive runs of parts of up to `TARGET_BYTES` together (at least one part each)."""
    groups: list[list[pafs.FileInfo]] = [[]]
    size = 0
    for part in parts:
        if groups[-1] and size + part.size > TARGET_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(part)
        size += part.size
    return groups


def _rewrite(
    storage: Storage, folder: str, group: list[pafs.FileInfo], seq: int, owner: leases.Owner
) -> None:
    """One compacted part from `group`, by the plan / part / removals steps."""
    fs = storage.resolve(folder).fs
    fmt = pds.ParquetFileFormat()
    fragments = [fmt.make_fragment(p.path, fs, file_size=p.size) for p in group]
    with ThreadPoolExecutor(READ_THREADS) as pool:  # each part as it was written
        tables = list(pool.map(lambda f: f.to_table(), fragments))
    # parts of one folder may differ (two tasks of one stage, a column added since): all kept
    table = pa.concat_tables(tables, promote_options="permissive")
    uid = uuid.uuid4().hex[:8]
    name = f"compacted-{seq:06d}-{uid}.parquet"
    plan = join(folder, f"{PLAN_PREFIX}{uid}.json")
    owner.check()
    storage.write_json(plan, {"part": name, "covers": [p.base_name for p in group]})
    storage.write_parquet(table, join(folder, name))
    storage.delete_files([join(folder, p.base_name) for p in group])
    storage.delete_file(plan)
