"""Starting a stand-in: a free loopback port, the server as a child process, and a wait until it
answers; and the one way every handle posts to a stand-in's control endpoints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# `cpr` as a user runs it, by this interpreter (the venv's, whatever PATH says)
CPR = [sys.executable, "-m", "cpr_ray.cpr_command"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def standin(name: str) -> list[str]:
    """The command line of a stand-in in this package (`scripted_llm`, `s2_api`, `gold_llm`), run
    as a module of the `tests` package from the repository root (`cwd=REPO`), so that it shares
    `tests/standins/controls.py` with the other stand-ins."""
    return [sys.executable, "-m", f"tests.standins.{name}"]


def start_local_server(
    args: list[str],
    health_path: str,
    log: Path,
    timeout_s: float = 30,
    *,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start a test server on a free loopback port (`{port}` in `args`); wait until it answers.
    `new_session`: the server and its children (a local Ray) in their own process group, for
    `os.killpg`."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=new_session,
            cwd=cwd,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}{health_path}", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                if not new_session:
                    proc.kill()
                else:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)  # its Ray too
                    except ProcessLookupError:
                        pass
                raise RuntimeError(f"{args[:3]} did not start; see {log}") from None
            time.sleep(0.2)


def post_json(url: str, payload: object) -> None:
    """POST a JSON body to a stand-in's control endpoint (faults, enforcement, marks)."""
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=10).read()
