"""Leases: a build says it is reading a build root, so the refresh's version cleanup waits.

Lance keeps every table version until `cleanup_old_versions` removes it; a build that opened
version N while the refresh removes N's files would fail mid-stage. Each `run_build` writes
``ROOT/_leases/{id}.json`` for its duration and removes it at the end; the cleanup runs only
when no lease younger than ``refresh.lease_ttl_hours`` exists (an older one is a build that
crashed without removing it).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from cpr_ray.storage import Storage, join

FOLDER = "_leases"


@contextmanager
def held(storage: Storage, purpose: str) -> Iterator[str]:
    """Hold a lease on the build root for the duration of the block."""
    lease_id = f"{purpose}-{uuid.uuid4().hex[:8]}"
    uri = join(storage.root, FOLDER, f"{lease_id}.json")
    storage.write_json(
        uri,
        {
            "purpose": purpose,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": dt.datetime.now(dt.timezone.utc).isoformat(),
        },
    )
    try:
        yield lease_id
    finally:
        storage.delete_file(uri)


def active(storage: Storage, ttl: dt.timedelta) -> list[str]:
    """Ids of leases taken less than `ttl` ago."""
    now = dt.datetime.now(dt.timezone.utc)
    out = []
    for info in storage.list_files(join(storage.root, FOLDER), (".json",), missing_ok=True):
        uri = f"s3://{info.path}" if storage.resolve(storage.root).is_s3 else info.path
        try:
            since = dt.datetime.fromisoformat(storage.read_json(uri)["since"])
        except (FileNotFoundError, KeyError, ValueError):
            continue  # removed meanwhile, or not a lease
        if now - since < ttl:
            out.append(info.base_name.removesuffix(".json"))
    return out
