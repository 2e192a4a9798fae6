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
from cpr_ray.storage.store import Storage, join

FOLDER = "_leases"
OWNER = "owner.json"
SUPERSEDED = "superseded"  # _leases/superseded/ID.json: when a taken-over lease stopped owning
READ = "read"  # the purpose of a reader's lease
HEARTBEAT_S = 60.0
STALE_AFTER_S = 5 * HEARTBEAT_S
JOB_ENV = "CPR_JOB_ID"
# a renewal's storage calls give up within this share of the slack between the heartbeat and
# staleness, so a store that hangs fails a beat, and the holder stops, before the lease is stale
BEAT_SHARE = 0.1
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


class RootOwned(UserError):
    """A refresh found the root owned by a process it cannot prove dead: a distinct exit code
    (75), so a scheduler retries it or alerts, and when a retry could succeed."""

    exit_code = 75  # EX_TEMPFAIL: a temporary failure, try again later

    def __init__(self, root: str, holder: Lease) -> None:
        self.holder = holder
        since = dt.datetime.fromisoformat(holder.since).strftime("%Y-%m-%d %H:%M:%S UTC")
        retry = holder.retry_after().strftime("%Y-%m-%d %H:%M:%S UTC")
        super().__init__(
            f"root owned by {holder.host} since {since}; retry after {retry} ({root}: a "
            f"{holder.purpose}, pid {holder.pid}, last heartbeat {holder.age_s():.0f} s ago; "
            "this refresh did nothing)"
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
    # where its process runs, to tell whether it still does (`provably_dead`): the kernel's
    # boot, the PID namespace and the process's start (clock ticks after boot); None in leases
    # written before them, or off Linux
    boot_id: str | None = None
    pid_ns: str | None = None
    started_ticks: int | None = None
    # the job it runs for ($CPR_JOB_ID: a RayJob's name, a submission id), shared by a retried
    # job's attempts: a later attempt takes over an earlier one's lease at once
    job: str | None = None
    # renewals of this lease so far: what a manifest published under it records
    generation: int = 0

    @classmethod
    def new(cls, purpose: str, stale_after_s: float, reads: Iterable[str] = ()) -> Lease:
        now = _now().isoformat()
        lease_id = f"{purpose}-{uuid.uuid4().hex[:8]}"
        host, pid = socket.gethostname(), os.getpid()
        boot_id, pid_ns = _machine()
        return cls(
            lease_id,
            purpose,
            host,
            pid,
            now,
            now,
            stale_after_s,
            tuple(reads),
            boot_id,
            pid_ns,
            _start_ticks(pid),
            os.environ.get(JOB_ENV) or None,
        )

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
        return replace(self, heartbeat=_now().isoformat(), generation=self.generation + 1)

    def age_s(self) -> float:
        return (_now() - dt.datetime.fromisoformat(self.heartbeat)).total_seconds()

    def alive(self) -> bool:
        return self.age_s() <= self.stale_after_s and not self.provably_dead()

    def provably_dead(self) -> bool:
        """Its process is gone, as this process can see: same boot of the same kernel and same
        PID namespace (containers on one host share the boot id, not the namespace; a host
        name proves neither), and no process with its PID started when it did (a PID reused
        since is another process)."""
        boot_id, pid_ns = _machine()
        if self.boot_id is None or (self.boot_id, self.pid_ns) != (boot_id, pid_ns):
            return False  # another machine or namespace: only its heartbeat tells
        return _start_ticks(self.pid) != self.started_ticks

    def earlier_attempt_of(self, other: Lease) -> bool:
        """This lease is an earlier attempt of `other`'s job (a job retried by its scheduler,
        whose killed attempt cannot have renewed it since)."""
        return self.job is not None and self.job == other.job and self.id != other.id

    def retry_after(self) -> dt.datetime:
        """When the lease goes stale unless renewed: the earliest a retry could take it."""
        return dt.datetime.fromisoformat(self.heartbeat) + dt.timedelta(seconds=self.stale_after_s)

    def describe(self) -> str:
        """One line an operator can act on: what holds it, where, since when, how fresh."""
        since = dt.datetime.fromisoformat(self.since).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"a {self.purpose} on {self.host} (pid {self.pid}) since {since}, last heartbeat "
            f"{self.age_s():.0f} s ago"
        )


def _machine() -> tuple[str | None, str | None]:
    """(this kernel's boot id, this process's PID namespace); None off Linux."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        return boot_id, os.readlink("/proc/self/ns/pid")
    except OSError:
        return None, None


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks after boot; None when there is none, or it
    has ended and waits for its parent to collect it (a zombie: a killed job driver can stay
    one for minutes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name: field 3 on
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])  # state, start time (22)


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
    """Call `beat` every `every_s` seconds from a thread while the block runs; whatever a beat
    raises, the next one comes (a beat that cannot renew says so itself)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            try:
                beat()
            except Exception as exc:  # noqa: BLE001 - a renewal failing must not end the loop
                console.print(f"lease heartbeat failed: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


class Owner:
    """The exclusive lease this process holds on a root, and whether it still holds it.

    Holding it is a fact about time, not about a thread: `check` refuses once the last renewal
    that reached the store is older than the slack (`stale_after_s - heartbeat_s`), whether the
    heartbeat thread failed, hangs or died. Renewals go through a store whose calls give up
    within `BEAT_SHARE` of that slack, so a hanging store stops the holder before another
    process may take the lease over."""

    def __init__(self, storage: Storage, lease: Lease, tag: str, heartbeat_s: float) -> None:
        self.slack_s = lease.stale_after_s - heartbeat_s
        if self.slack_s <= 0:
            raise ValueError("a lease's stale_after_s must exceed its heartbeat_s")
        self.storage = storage.bounded(BEAT_SHARE * self.slack_s)
        self.lease = lease
        self.tag = tag
        self.uri = owner_uri(storage)
        self.lost: str | None = None
        self._renewed = time.monotonic()

    def beat(self) -> None:
        """Renew the heartbeat, only over the version this holder wrote last."""
        if self.lost:
            return
        started = time.monotonic()
        lease = self.lease.beat()
        try:
            tag = self.storage.write_if(self.uri, lease.to_bytes(), tag=self.tag)
            if tag is None:  # not ours any more, unless our last write landed and its reply not
                found = _read(self.storage, self.uri)
                if found and found[0] and found[0].id == lease.id:
                    tag = found[1]
                    lease = found[0]
                else:
                    holder = found[0].describe() if found and found[0] else "nobody"
                    self.lost = f"taken over (it is held by {holder})"
                    return
        except Exception as exc:  # noqa: BLE001 - whatever failed, the lease was not renewed
            if time.monotonic() - self._renewed > self.slack_s:
                self.lost = f"not renewed for {self.slack_s:.1f} s ({type(exc).__name__}: {exc})"
            return
        # renewed as of when the write was sent: the store may have applied it any time after
        self.lease, self.tag, self._renewed = lease, tag, started

    def check(self) -> None:
        """Refuse unless this holder renewed its lease within the slack, by this process's
        monotonic clock (a taker waits `stale_after_s` after the heartbeat it read)."""
        if self.lost is None and time.monotonic() - self._renewed > self.slack_s:
            self.lost = f"not renewed for {time.monotonic() - self._renewed:.1f} s"
        if self.lost:
            raise LeaseLost(
                f"{self.storage.root}: the lease of this {self.lease.purpose} was {self.lost}; "
                "it publishes nothing more: run it again once the root is free"
            )

    def fence(self) -> int:
        """Renew the lease now, conditionally on the version this holder wrote last, and
        return its generation: what a publish records, right before it writes. Raises
        `LeaseLost` when the lease is not ours or the renewal is late."""
        self.check()
        generation = self.lease.generation
        self.beat()
        self.check()
        if self.lease.generation == generation:  # the store did not take the renewal
            raise LeaseLost(
                f"{self.storage.root}: the lease of this {self.lease.purpose} could not be "
                "renewed right before publishing; it publishes nothing: run it again"
            )
        return self.lease.generation


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
        earlier = current is not None and current.earlier_attempt_of(lease)
        if current is not None and current.alive() and not earlier:
            raise RootBusy(storage.root, current, lease.purpose)
        if (tag := storage.write_if(uri, data, tag=current_tag)) is not None:
            what = current.describe() if current is not None else "an unreadable lease"
            why = "this job's earlier attempt" if earlier else "stale"
            console.print(f"took over the lease on {storage.root} ({why}) of {what}")
            if current is not None:
                _record_takeover(storage, current, lease)
            return tag
        # another taker replaced it first: look again
    found = _read(storage, uri)
    if found and found[0] is not None and found[0].alive():
        raise RootBusy(storage.root, found[0], lease.purpose)
    raise StorageError(
        f"{uri} changed hands {_TAKE_TRIES} times while this process tried to take it; try again"
    )


def _superseded_uri(storage: Storage, lease_id: str) -> str:
    return join(storage.root, FOLDER, SUPERSEDED, f"{lease_id}.json")


def _record_takeover(storage: Storage, old: Lease, new: Lease) -> None:
    """Say when (by the store's clock: its time of our takeover write) `old` stopped owning
    the root, so readers ignore what its holder still publishes after (`superseded`)."""
    taken_at = storage.written_at(owner_uri(storage))
    if taken_at is None:  # deleted between our takeover write and this read: not ours any more
        raise LeaseLost(f"the lease on {storage.root} vanished right after this run took it over")
    record = {"by": new.id, "generation": old.generation, "taken_at": taken_at.isoformat()}
    storage.write_text(_superseded_uri(storage, old.id), json.dumps(record))


def superseded(storage: Storage, published: dict, uri: str) -> bool:
    """Whether the manifest `published` at `uri` was written under a lease after that lease
    was taken over: a holder that paused past staleness between its fence and its write (the
    write landed late) published it, and readers ignore it."""
    fenced = published.get("lease")
    if not fenced:
        return False
    # a listing, not a read of a key that is usually missing (S3 answers 403 for one unless
    # the caller may list): the folder is empty unless a lease was ever taken over
    names = {i.base_name for i in storage.list_folder(join(storage.root, FOLDER, SUPERSEDED))}
    if f"{fenced['id']}.json" not in names:
        return False
    record = json.loads(storage.read_bytes(_superseded_uri(storage, fenced["id"])))
    written = storage.written_at(uri)
    return written is not None and written >= dt.datetime.fromisoformat(record["taken_at"])


def fence(storage: Storage) -> dict | None:
    """Right before a stage writes its manifest: this thread's lease renewed now, conditionally
    on the version it wrote last (`Owner.fence`), as the manifest records it; None for a stage
    run on its own outside a build (no other live process may own the root)."""
    held = _held().get(storage.root)
    if held is None:
        check_owner(storage)
        return None
    return {"id": held.lease.id, "generation": held.fence()}


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
    held = Owner(storage, lease, _take(storage, lease), heartbeat_s)
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
