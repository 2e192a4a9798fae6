"""Leases: one owner of a build root at a time, and the run folders its readers still need.

**Owner.** A build or a refresh changes a root only while it holds ``ROOT/_leases/owner.json``.
It takes the lease with a write the store performs only where no lease exists (S3
``If-None-Match: *``; locally a hard link, see `Storage.write_if`), so of a build and a refresh
started together exactly one gets it: there is no check that a second process could slip past.
The holder rewrites its heartbeat every `heartbeat_s` seconds from a thread, each rewrite
conditional on the version it wrote last, and removes the lease (conditionally) when it ends. A
lease is stale when its heartbeat is older than the `stale_after_s` it declares (its process was
killed, or lost the store), or at once when it names this host and a process that is not
running. A stale lease is taken over with a write conditional on the version read (S3
``If-Match``), so of two takers exactly one wins. A holder whose lease was taken over finds out at
its next heartbeat, and a stage publishes nothing after that (`check_owner`). Hosts' clocks are
assumed to agree to well under `stale_after_s` (minutes; NTP keeps them to milliseconds).

**Readers.** A training, index or evaluation run that reads a build's output registers
``ROOT/_leases/read-{id}.json`` naming the run folder it reads, kept alive the same way but
shared by any number of readers. A stage's cleanup of old runs keeps every folder a live reader
pins (`pins`), and the refresh removes no old corpus table versions while a reader of the corpus
is live.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from rich.console import Console

from cpr_ray.errors import StorageError, UserError
from cpr_ray.storage import Storage, join

FOLDER = "_leases"
OWNER = "owner.json"
READ = "read"  # the purpose of a reader's lease
HEARTBEAT_S = 60.0
STALE_AFTER_S = 5 * HEARTBEAT_S
# a stage's run folder, where `stage.run_stage` writes: ROOT/STAGE/runs/RUN_ID
RUN_FOLDER = re.compile(r"^(?P<root>.+)/[^/]+/runs/\d{8}T\d{6}Z-[0-9a-f]{6}(?=/|$)")
_TAKE_TRIES = 5

console = Console(stderr=True)


class RootBusy(UserError):
    """Another live build or refresh owns the root."""

    def __init__(self, root: str, holder: Lease, purpose: str) -> None:
        self.holder = holder
        super().__init__(
            f"{root} is in use by {holder.describe()}: this {purpose} did nothing; run it again "
            f"once that {holder.purpose} has ended (a killed one's lease is stale "
            f"{holder.stale_after_s:.0f} s after its last heartbeat)"
        )


class LeaseLost(UserError):
    """This process's lease on the root was taken over, or could not be renewed."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class Lease:
    """What a lease file holds: who, since when, last heartbeat, and what it reads."""

    id: str
    purpose: str
    host: str
    pid: int
    since: str
    heartbeat: str
    stale_after_s: float
    reads: tuple[str, ...] = ()

    @classmethod
    def new(cls, purpose: str, stale_after_s: float, reads: Iterable[str] = ()) -> Lease:
        now = _now().isoformat()
        lease_id = f"{purpose}-{uuid.uuid4().hex[:8]}"
        host, pid = socket.gethostname(), os.getpid()
        return cls(lease_id, purpose, host, pid, now, now, stale_after_s, tuple(reads))

    @classmethod
    def parse(cls, data: bytes) -> Lease | None:
        """The lease, or None for a file that is not one (a crash cannot leave half a file: both
        backends write whole)."""
        try:
            obj = json.loads(data)
            return cls(**{**obj, "reads": tuple(obj.get("reads", ()))})
        except (ValueError, TypeError):
            return None

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    def beat(self) -> Lease:
        return replace(self, heartbeat=_now().isoformat())

    def age_s(self) -> float:
        return (_now() - dt.datetime.fromisoformat(self.heartbeat)).total_seconds()

    def alive(self) -> bool:
        if self.age_s() > self.stale_after_s:
            return False
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True  # someone else's process, alive
        return True

    def describe(self) -> str:
        """One line an operator can act on: what holds it, where, since when, how fresh."""
        since = dt.datetime.fromisoformat(self.since).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"a {self.purpose} on {self.host} (pid {self.pid}) since {since}, last heartbeat "
            f"{self.age_s():.0f} s ago"
        )


def owner_uri(storage: Storage) -> str:
    return join(storage.root, FOLDER, OWNER)


def _read(storage: Storage, uri: str) -> tuple[Lease | None, str] | None:
    """The lease at `uri` (None if unreadable) and its version tag; None if there is none."""
    try:
        data, tag = storage.read_tagged(uri)
    except FileNotFoundError:
        return None
    return Lease.parse(data), tag


@contextmanager
def _beating(every_s: float, beat: Callable[[], None], name: str) -> Iterator[None]:
    """Call `beat` every `every_s` seconds from a thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            beat()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


class Owner:
    """The exclusive lease this process holds on a root, and whether it still holds it."""

    def __init__(self, storage: Storage, lease: Lease, tag: str) -> None:
        self.storage = storage
        self.lease = lease
        self.tag = tag
        self.uri = owner_uri(storage)
        self.lost: str | None = None
        self._renewed = time.monotonic()

    def beat(self) -> None:
        """Renew the heartbeat, only over the version this holder wrote last."""
        if self.lost:
            return
        lease = self.lease.beat()
        try:
            tag = self.storage.write_if(self.uri, lease.to_bytes(), tag=self.tag)
            if tag is None:  # not ours any more, unless our last write landed and its reply not
                found = _read(self.storage, self.uri)
                if found and found[0] and found[0].id == lease.id:
                    tag = found[1]
                else:
                    holder = found[0].describe() if found and found[0] else "nobody"
                    self.lost = f"taken over (it is held by {holder})"
                    return
        except StorageError as exc:
            if time.monotonic() - self._renewed > self.lease.stale_after_s:
                self.lost = f"not renewed for {self.lease.stale_after_s:.0f} s ({exc})"
            return
        self.lease, self.tag, self._renewed = lease, tag, time.monotonic()

    def check(self) -> None:
        if self.lost:
            raise LeaseLost(
                f"{self.storage.root}: the lease of this {self.lease.purpose} was {self.lost}; "
                "it publishes nothing more: run it again once the root is free"
            )


_local = threading.local()  # .held: root -> the owner lease this thread's build or refresh holds


def _held() -> dict[str, Owner]:
    """The owner leases of this thread: a build runs its stages in the thread that took the
    lease (a refresh passes its own to the build it runs), and two threads of one process that
    race for a root must not count as one holder."""
    if not hasattr(_local, "held"):
        _local.held = {}
    return _local.held


def _take(storage: Storage, lease: Lease) -> str:
    """Create the owner lease, or take over a stale one; the version tag of what we wrote."""
    uri, data = owner_uri(storage), lease.to_bytes()
    for _ in range(_TAKE_TRIES):
        tag = storage.write_if(uri, data)
        if tag is not None:
            return tag
        found = _read(storage, uri)
        if found is None:
            continue  # released since: create it again
        current, current_tag = found
        if current is not None and current.id == lease.id:
            return current_tag  # our create landed; its reply was lost and the retry refused
        if current is not None and current.alive():
            raise RootBusy(storage.root, current, lease.purpose)
        if (tag := storage.write_if(uri, data, tag=current_tag)) is not None:
            what = current.describe() if current is not None else "an unreadable lease"
            console.print(f"took over the stale lease on {storage.root} of {what}")
            return tag
        # another taker replaced it first: look again
    found = _read(storage, uri)
    if found and found[0] is not None and found[0].alive():
        raise RootBusy(storage.root, found[0], lease.purpose)
    raise StorageError(
        f"{uri} changed hands {_TAKE_TRIES} times while this process tried to take it; try again"
    )


@contextmanager
def owner(
    storage: Storage,
    purpose: str,
    *,
    heartbeat_s: float = HEARTBEAT_S,
    stale_after_s: float = STALE_AFTER_S,
) -> Iterator[Owner]:
    """Own the build root for the block, or raise `RootBusy` naming the live owner."""
    lease = Lease.new(purpose, stale_after_s)
    held = Owner(storage, lease, _take(storage, lease))
    _held()[storage.root] = held
    try:
        with _beating(heartbeat_s, held.beat, f"lease-{lease.id}"):
            yield held
    finally:
        _held().pop(storage.root, None)
        if held.lost is None:
            try:
                storage.delete_if(held.uri, held.tag)
            except StorageError:
                pass  # the store is out of reach: the lease goes stale instead


def held(storage: Storage) -> Owner | None:
    """The owner lease this thread holds on the root (its build's or refresh's), if any: what
    a change that must have one writer at a time (a compaction) runs under."""
    return _held().get(storage.root)


def check_owner(storage: Storage) -> None:
    """Before a stage publishes: this process still owns the root, or (a stage run on its own,
    outside a build) no other live process does."""
    held = _held().get(storage.root)
    if held is not None:
        held.check()
        return
    found = _read(storage, owner_uri(storage))
    if found and found[0] is not None and found[0].alive():
        raise RootBusy(storage.root, found[0], "stage")


def current_owner(storage: Storage) -> Lease | None:
    """The live build or refresh that owns the root now, if any (what `cpr stats --watch`
    follows: a lease gone or stale is a run that ended or was killed)."""
    found = _read(storage, owner_uri(storage))
    if found and found[0] is not None and found[0].alive():
        return found[0]
    return None


def _leases(storage: Storage) -> list[Lease]:
    is_s3 = storage.resolve(storage.root).is_s3
    out = []
    for info in storage.list_files(join(storage.root, FOLDER), (".json",), missing_ok=True):
        try:
            lease = Lease.parse(storage.read_bytes(f"s3://{info.path}" if is_s3 else info.path))
        except StorageError:
            continue  # removed meanwhile
        if lease is not None:
            out.append(lease)
    return out


def readers(storage: Storage, folder: str | None = None) -> list[Lease]:
    """The live readers' leases on the root (those whose pins touch `folder`, if given)."""
    return [
        lease
        for lease in _leases(storage)
        if lease.purpose == READ
        and lease.alive()
        and (folder is None or covers(lease.reads, folder))
    ]


def pins(storage: Storage) -> set[str] | None:
    """The folders live readers pin; None while another process owns the root (any run folder
    may then be one it is writing, so nothing may be removed). A killed reader's lease, which
    nothing else would ever remove, goes."""
    held = _held().get(storage.root)
    out: set[str] = set()
    for lease in _leases(storage):
        if not lease.alive():
            if lease.purpose == READ:
                storage.delete_file(join(storage.root, FOLDER, f"{lease.id}.json"))
            continue
        if lease.purpose == READ:
            out.update(lease.reads)
        elif held is None or held.lease.id != lease.id:
            return None
    return out


def covers(pinned: Iterable[str], folder: str) -> bool:
    """Whether removing `folder` would remove something pinned (or the pin's own folder)."""
    folder = folder.rstrip("/")
    return any(
        p == folder or p.startswith(f"{folder}/") or folder.startswith(f"{p}/") for p in pinned
    )


@contextmanager
def reading(
    storage: Storage,
    uri: str | None,
    *,
    heartbeat_s: float = HEARTBEAT_S,
    stale_after_s: float = STALE_AFTER_S,
) -> Iterator[Lease | None]:
    """Pin the build run folder `uri` lies in (``ROOT/STAGE/runs/RUN``: an export, the ingest
    tables) for as long as the block reads it, so no cleanup removes it meanwhile; data outside
    a build's run folders (a BEIR file, a hand-made export) needs no pin."""
    found = RUN_FOLDER.match(storage.resolve(uri).uri) if uri else None
    if found is None:
        yield None
        return
    lease = Lease.new(READ, stale_after_s, reads=(found[0],))
    lease_uri = join(found["root"], FOLDER, f"{lease.id}.json")
    storage.write_text(lease_uri, lease.to_bytes().decode())

    def beat() -> None:
        try:
            storage.write_text(lease_uri, lease.beat().to_bytes().decode())
        except StorageError:
            pass  # the next beat tries again; a reader that stays cut off goes stale

    try:
        with _beating(heartbeat_s, beat, f"lease-{lease.id}"):
            yield lease
    finally:
        storage.delete_file(lease_uri)
