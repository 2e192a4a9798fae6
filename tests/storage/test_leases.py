"""One owner of a build root at a time, and readers' pins, on a local root and on the loopback S3:
the conditional writes they rest on, two takers racing for a stale lease, a holder whose lease
was taken over, a build refused by a refresh's lease, and an export read by a training,
evaluation or index run surviving the cleanup of a newer export's publication (no Ray)."""

from __future__ import annotations

import ctypes
import dataclasses
import datetime as dt
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cpr_ray.config import load_config
from cpr_ray.cpr_command import app
from cpr_ray.dataset.format import CORPUS
from cpr_ray.runs.stage_runner import StageOutput, StageRun, manifest_uri, read_manifest, run_stage
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, StorageConfig, join
from tests.evaluate.test_evaluate_loaders import make_cpr_export
from tests.runs.test_cli import error_line


def poll(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_conditional_writes_let_exactly_one_writer_win(storage):
    uri = join(storage.root, "_leases", "x.json")
    with pytest.raises(FileNotFoundError):
        storage.read_tagged(uri)
    first = storage.write_if(uri, b"one")
    assert first is not None and storage.write_if(uri, b"two") is None  # exists already
    assert storage.read_tagged(uri) == (b"one", first)
    second = storage.write_if(uri, b"two", tag=first)
    assert second not in (None, first)
    assert storage.write_if(uri, b"three", tag=first) is None  # a stale version
    assert storage.read_tagged(uri) == (b"two", second)
    assert not storage.delete_if(uri, first) and storage.delete_if(uri, second)
    assert storage.write_if(uri, b"four", tag=second) is None  # nothing there to replace
    assert storage.write_if(uri, b"one") == first  # the same tag on both backends: the MD5


def _stale(purpose: str) -> leases.Lease:
    """A lease whose holder stopped renewing it (on another host) long ago."""
    long_ago = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).isoformat()
    lease = leases.Lease.new(purpose, stale_after_s=60)
    return dataclasses.replace(lease, host="elsewhere", heartbeat=long_ago)


def _race(storage: Storage, takers: int) -> tuple[list[str], list[leases.RootBusy]]:
    """`takers` threads released at once, each trying to own the root; the winners hold on
    until every one has an answer."""
    start, done = threading.Barrier(takers), threading.Event()
    won: list[str] = []
    refused: list[leases.RootBusy] = []

    def take(purpose: str) -> None:
        start.wait()
        try:
            with leases.owner(storage, purpose) as held:
                won.append(held.lease.id)
                done.wait(10)
        except leases.RootBusy as busy:
            refused.append(busy)

    threads = [threading.Thread(target=take, args=(f"t{i}",)) for i in range(takers)]
    for t in threads:
        t.start()
    poll(lambda: len(won) + len(refused) == takers)
    done.set()
    for t in threads:
        t.join()
    return won, refused


def test_two_takers_racing_for_a_stale_lease_exactly_one_wins(storage):
    for _ in range(3):
        storage.write_text(leases.owner_uri(storage), _stale("build").to_bytes().decode())
        won, refused = _race(storage, 4)
        assert len(won) == 1 and len(refused) == 3
        assert all(busy.holder.id == won[0] for busy in refused)  # each names the winner
        assert not storage.exists(leases.owner_uri(storage))  # the winner released it


# a heartbeat in tenths of a second: a lease is stale a second after its last renewal
BEAT = {"heartbeat_s": 0.1, "stale_after_s": 1.0}


def _stage(storage: Storage, work: Callable[[], None]) -> dict:
    """A real stage (`run_stage`: what every stage publishes through) that runs `work`."""

    def write(run: StageRun) -> StageOutput:
        work()
        storage.write_text(join(run.out, "corpus.parquet"), "rows")
        return StageOutput(tables={"corpus": {"uri": join(run.out, "corpus.parquet")}})

    cfg = load_config("dry-run", env={}, overrides=[f"storage.root={storage.root}"])
    return run_stage("export", cfg, storage, {"run": uuid.uuid4().hex}, (), write)


def _kill(thread_name: str) -> None:
    """End a thread from outside, as a crash in it would: SystemExit raised in it while it
    waits between beats (raised amid a storage call, it could die holding a client's lock)."""
    [thread] = [t for t in threading.enumerate() if t.name == thread_name]
    poll(lambda: sys._current_frames()[thread.ident].f_code.co_name == "wait")
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit)
    )
    thread.join(10)
    assert not thread.is_alive()


def _stale_by_age(storage: Storage) -> bool:
    return not leases.Lease.parse(storage.read_tagged(leases.owner_uri(storage))[0]).alive()


def test_a_stage_running_longer_than_stale_after_keeps_its_lease(storage):
    """A stage working 2.5 × `stale_after_s` keeps the root: its heartbeat renews the lease
    meanwhile (a taker is refused), and it publishes, recording the lease's generation."""

    def work() -> None:
        time.sleep(2.5)
        with pytest.raises(leases.RootBusy):
            with leases.owner(storage, "refresh"):
                pass

    with leases.owner(storage, "build", **BEAT) as held:
        manifest = _stage(storage, work)
    assert manifest["lease"]["id"] == held.lease.id and manifest["lease"]["generation"] >= 5
    assert read_manifest(storage, "export") == manifest


def test_a_holder_whose_heartbeat_thread_died_publishes_nothing(storage):
    """The heartbeat thread killed mid-stage: the lease is not renewed, the stage's publish is
    refused (by the holder's own clock, before anyone took the lease over), the published
    manifest stays the one before, and the stale lease is taken over."""
    before = _stage(storage, lambda: None)
    with leases.owner(storage, "build", **BEAT) as held:

        def work() -> None:
            _kill(f"lease-{held.lease.id}")
            poll(lambda: _stale_by_age(storage))

        with pytest.raises(leases.LeaseLost, match="not renewed for"):
            _stage(storage, work)
        with leases.owner(storage, "refresh") as taker:  # stale: taken over at once
            assert taker.lease.id != held.lease.id
    assert read_manifest(storage, "export") == before


def test_a_manifest_landing_after_its_lease_was_taken_over_is_ignored_by_readers(storage):
    """The window the fence leaves: a holder renewed its lease for a publish, then paused past
    staleness before its manifest write landed. The taker recorded when it took the root over
    (by the store's clock); readers ignore that lease's manifest written at or after then, and
    keep what it published before."""
    uri = manifest_uri(storage, "export")
    with leases.owner(storage, "build", **BEAT) as held:
        before = _stage(storage, lambda: None)
        _kill(f"lease-{held.lease.id}")
        poll(lambda: _stale_by_age(storage))
        with leases.owner(storage, "refresh") as taker:
            assert taker.lease.id != held.lease.id
            assert read_manifest(storage, "export") == before  # published before the takeover
            storage.write_json(uri, {**before, "run": "late"})  # the paused write lands now
            assert storage.read_json(uri)["lease"]["id"] == held.lease.id
            assert read_manifest(storage, "export") is None  # the stage runs again


@pytest.fixture()
def proxied(s3_endpoint: str, s3_bucket: str, faults) -> tuple[Storage, Storage]:
    """One S3 root through the fault proxy (the holder's) and straight (the taker's, a
    reader's)."""
    root = f"s3://{s3_bucket}/root"
    return (
        Storage(StorageConfig(root=root, s3_endpoint=faults.url)),
        Storage(StorageConfig(root=root, s3_endpoint=s3_endpoint)),
    )


def _take_over_then(direct: Storage, then: Callable[[], None]) -> threading.Thread:
    """Another process's refresh: once the lease is stale, it takes it over, then runs `then`,
    and holds the root until the test has looked."""
    taken = threading.Event()

    def take() -> None:
        poll(lambda: _stale_by_age(direct), timeout_s=30)
        with leases.owner(direct, "refresh", **BEAT):
            taken.set()
            then()

            time.sleep(0.5)

    thread = threading.Thread(target=take)
    thread.start()
    return thread


def test_a_holder_blocked_past_stale_after_is_taken_over_and_its_late_publish_refused(
    proxied, faults
):
    """The store holds the holder's renewals (a network that hangs) past `stale_after_s`:
    another process takes the lease over, the held calls then go on and fail their condition,
    and the holder's publish is refused; the reader sees no manifest."""
    via_proxy, direct = proxied
    with leases.owner(via_proxy, "build", **BEAT):

        def work() -> None:
            faults.hold(r"owner\.json")
            _take_over_then(direct, faults.release).join(60)

        with pytest.raises(leases.LeaseLost):
            _stage(via_proxy, work)
    assert read_manifest(direct, "export") is None
    assert faults.stats()["held"] > 0


def test_a_lease_is_stale_once_its_holder_is_killed_on_this_host_or_silent_anywhere():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lease = leases.Lease.new("build", stale_after_s=60)
    assert lease.alive()
    assert not dataclasses.replace(lease, pid=dead.pid).alive()  # this host, no such process
    assert not _stale("build").alive()
    assert dataclasses.replace(_stale("build"), heartbeat=lease.heartbeat).alive()  # elsewhere


def test_a_build_finding_a_refresh_stops_in_one_line_and_does_nothing(tmp_path):
    root = Storage(StorageConfig(root=str(tmp_path)))
    args = ["build", "--profile", "dry-run", "--stages", "venues"]
    with leases.owner(root, "refresh"):
        result = CliRunner().invoke(app, [*args, "--set", f"storage.root={tmp_path}"])
    line = error_line(result)
    assert line.startswith(f"{tmp_path} is in use by a refresh on ") and "last heartbeat" in line
    assert "this build did nothing" in line
    assert not (tmp_path / "venues").exists()


def _publish(storage: Storage, rows: str, *, export: bool = False) -> dict:
    """A run of the export stage, published as every stage publishes: a file, or (`export`, on
    a local root) a small export in the DESIGN.md format that training can read too."""

    def write(run: StageRun) -> StageOutput:
        if not export:
            storage.write_text(join(run.out, "corpus.parquet"), rows)
            return StageOutput(tables={"corpus": {"uri": join(run.out, "corpus.parquet")}})
        made = make_cpr_export(Path(run.out))
        train = [{**r, "negative_ids": r["candidate_ids"][1:4]} for r in made["rows"]]
        pq.write_table(pa.Table.from_pylist(train), Path(run.out) / "cpr-train.parquet")
        corpus = pa.Table.from_pylist(made["corpus"], schema=CORPUS)  # topics too, for search
        pq.write_table(corpus, Path(run.out) / "corpus.parquet")
        return StageOutput(tables={"corpus": {"uri": join(run.out, "corpus.parquet")}})

    cfg = load_config("dry-run", env={}, overrides=[f"storage.root={storage.root}"])
    return run_stage("export", cfg, storage, {"rows": rows}, (), write)


def test_an_export_being_read_survives_a_newer_export_and_goes_once_its_reader_is_done(storage):
    with leases.owner(storage, "build"):
        read = _publish(storage, "first")["output"]
    crashed = join(storage.root, "export", "runs", "20260101T000000Z-0c0ffe")  # no manifest
    storage.write_text(join(crashed, "part.txt"), "left by a killed run")
    killed = dataclasses.replace(_stale(leases.READ), reads=(crashed,))  # pins nothing
    killed_uri = join(storage.root, leases.FOLDER, f"{killed.id}.json")
    storage.write_text(killed_uri, killed.to_bytes().decode())
    with leases.reading(storage, join(read, "cpr-train.parquet")) as reader:
        assert reader is not None and reader.reads == (read,)
        with leases.owner(storage, "refresh"):
            newer = _publish(storage, "second")["output"]
        assert storage.exists(read) and not storage.exists(crashed)
        assert not storage.exists(killed_uri)  # nothing else would remove a killed reader's
        assert storage.read_json(join(storage.root, "export", "_MANIFEST.json"))["output"] == newer
    assert leases.readers(storage) == []
    with leases.owner(storage, "refresh"):
        newest = _publish(storage, "third")["output"]
    assert not storage.exists(read) and not storage.exists(newer) and storage.exists(newest)


def _spy(monkeypatch, module, name: str, storage: Storage, seen: list) -> None:
    """`module.name` as it is, noting the live readers of `storage`'s root when it is called,
    then stopping the run: what a reader holds while it reads is what is checked."""
    real = getattr(module, name)

    def spied(*args, **kwargs):
        seen.append([r.reads for r in leases.readers(storage)])
        real(*args, **kwargs)
        raise _Stop

    monkeypatch.setattr(module, name, spied)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("reader", ["train", "eval", "index"])
def test_training_evaluation_and_index_pin_the_export_run_they_read(
    reader, tmp_path, monkeypatch, minilm
):
    storage = Storage(StorageConfig(root=str(tmp_path / "root")))
    with leases.owner(storage, "build"):
        export = _publish(storage, "one", export=True)["output"]
    seen: list = []
    if reader == "train":
        from cpr_ray.train import trainer as module

        run, name = module.run_train, "read_examples"
        flags = {"train.data": export, "train.out": str(tmp_path / "out")}
    elif reader == "eval":
        from cpr_ray.evaluate import eval_run as module

        run, name = module.run_eval, "load_benchmark"
        flags = {"eval.benchmark": "cpr", "eval.data": export, "eval.retriever": "dense"}
    else:
        from cpr_ray.search import sharded_index as module

        run, name = module.build_index, "load_documents"
        flags = {"search.corpus": export, "search.out": str(tmp_path / "idx")}
    _spy(monkeypatch, module, name, storage, seen)
    with pytest.raises(_Stop):
        run(load_config(flags={"encoder.model": minilm, **flags}, env={}))
    assert seen == [[(export,)]]  # pinned while it read
    assert leases.readers(storage) == []  # and released, even by a run that stopped
