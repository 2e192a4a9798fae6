"""Leases on a build root: live while their process runs, stale once it is killed (no Ray)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

from cpr_ray import leases
from cpr_ray.storage import Storage, StorageConfig, join


def test_a_held_lease_is_live_and_gone_after_the_block(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    assert leases.active(storage) == []
    with leases.held(storage, "build") as lease:
        assert leases.active(storage) == [lease]
        assert leases.active(storage, purpose="refresh") == []
    assert leases.active(storage) == []


def test_a_killed_holders_lease_is_stale_on_its_host_and_an_old_heartbeat_anywhere(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    now = dt.datetime.now(dt.timezone.utc)
    with leases.held(storage, "refresh") as live:
        record = storage.read_json(join(storage.root, leases.FOLDER, f"{live}.json"))
        for name, changes in {
            "refresh-killed": {"pid": dead.pid},  # this host, no such process
            "refresh-silent": {
                "host": "elsewhere",
                "heartbeat": (now - dt.timedelta(seconds=leases.STALE_AFTER_S + 1)).isoformat(),
            },
            "refresh-remote": {"host": "elsewhere", "heartbeat": now.isoformat()},
        }.items():
            storage.write_json(
                join(storage.root, leases.FOLDER, f"{name}.json"), {**record, **changes}
            )
        assert sorted(leases.active(storage, purpose="refresh")) == sorted([live, "refresh-remote"])
