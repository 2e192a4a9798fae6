"""Leases: a build or a refresh says it is using a build root, for as long as it is alive.

Lance keeps every table version until `cleanup_old_versions` removes it; a build that opened
version N while the refresh removes N's files would fail mid-stage, and two refreshes applying
diffs at once would interleave their steps. Each `run_build` and each refresh writes
``ROOT/_leases/{purpose}-{id}.json`` and rewrites its heartbeat every `HEARTBEAT_S` seconds
from a thread until it ends and removes it. A lease is stale — its process was killed — when
its heartbeat is older than `STALE_AFTER_S`, or at once when it names this host and a process
id that is not running. The cleanup runs only when no other live lease exists, and a refresh
does not start while another holds one.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cpr_ray.storage import Storage, join

FOLDER = "_leases"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 5 * HEARTBEAT_S


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _record(purpose: str, since: str) -> dict[str, Any]:
    return {
        "purpose": purpose,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": since,
        "heartbeat": _now().isoformat(),
    }


@contextmanager
def held(storage: Storage, purpose: str) -> Iterator[str]:
    """Hold a lease on the build root for the duration of the block."""
    lease_id = f"{purpose}-{uuid.uuid4().hex[:8]}"
    uri = join(storage.root, FOLDER, f"{lease_id}.json")
    since = _now().isoformat()
    storage.write_json(uri, _record(purpose, since))
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            storage.write_json(uri, _record(purpose, since))

    thread = threading.Thread(target=beat, name=f"lease-{lease_id}", daemon=True)
    thread.start()
    try:
        yield lease_id
    finally:
        stop.set()
        thread.join(timeout=10)
        storage.delete_file(uri)


def _alive(lease: dict[str, Any]) -> bool:
    age = (_now() - dt.datetime.fromisoformat(lease["heartbeat"])).total_seconds()
    if age > STALE_AFTER_S:
        return False
    if lease.get("host") == socket.gethostname():
        try:
            os.kill(int(lease["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # someone else's process, alive
    return True


def active(storage: Storage, purpose: str | None = None) -> list[str]:
    """Ids of the live leases (of `purpose`, or any) on the root."""
    is_s3 = storage.resolve(storage.root).is_s3
    out = []
    for info in storage.list_files(join(storage.root, FOLDER), (".json",), missing_ok=True):
        lease_id = info.base_name.removesuffix(".json")
        if purpose is not None and not lease_id.startswith(f"{purpose}-"):
            continue
        try:
            lease = storage.read_json(f"s3://{info.path}" if is_s3 else info.path)
            if _alive(lease):
                out.append(lease_id)
        except (FileNotFoundError, KeyError, ValueError):
            continue  # removed meanwhile, or not a lease
    return out
