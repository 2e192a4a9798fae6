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

The index has a BM25 side beside the dense one (over the bundled sample's abstracts, repeated),
as `cpr index` builds it by default, so the service fuses both (hybrid); the first phases run
once with ``"retriever": "dense"`` (dense alone, the same service and index) and once hybrid,
and the memory of the index in one process (what each search replica holds: its resident set
after loading the index, dense only and with BM25, and the BM25 arrays' bytes) is printed
before them, with the replica's own resident set once it has served.
Usage:

    python benchmarks/search_load.py [--papers 50000] [--seconds 20] [--max-ongoing 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

from cpr_ray.storage.store import join  # noqa: E402

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


def one(url: str, i: int, retriever: str | None = None) -> tuple[int, float]:
    body = {
        "query": QUESTIONS[i % len(QUESTIONS)],
        "k": 10,
        "other_fields_only": True,
        "before": 2015,
        **({"retriever": retriever} if retriever else {}),
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


def phase(
    url: str, clients: int, seconds: float, retriever: str | None = None
) -> tuple[Counter, list[float], float]:
    stop = time.perf_counter() + seconds
    statuses: Counter = Counter()
    latencies: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            status, took = one(url, c * 1000 + n, retriever)
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
        f"  {name:<26} {clients:>3} clients  {statuses[200] / wall:7.1f} answered/s  "
        f"p50 {p50:6.1f}  p95 {p95:6.1f}  p99 {p99:6.1f} ms   {total} requests ({counts})"
    )


LOAD = """
import json, sys, tracemalloc, psutil, bm25s, faiss
from cpr_ray.config import load_config
from cpr_ray.retrieval.bm25 import BM25Retriever
from cpr_ray.search.engine import SearchIndex
from cpr_ray.storage.store import Storage, join
storage = Storage(load_config().storage)
me = psutil.Process()
before = me.memory_info().rss
index = SearchIndex.load(storage, sys.argv[1])
after = me.memory_info().rss
bm25 = 0.0
if index.bm25 is not None:  # the BM25 side alone, loaded again under tracemalloc
    tracemalloc.start()
    kept = BM25Retriever.load(storage, join(sys.argv[1], index.manifest["bm25"]))
    bm25 = tracemalloc.get_traced_memory()[0] / 2**20
print(json.dumps({"rss_mib": (after - before) / 2**20, "bm25_mib": bm25}))
"""


def index_memory(root: str) -> dict[str, float]:
    """Resident-set growth of a fresh process loading the index at `root` (its libraries
    imported first), and the memory of its BM25 side alone by tracemalloc (its arrays and its
    vocabulary: what BM25 adds to each search replica; the resident set moves with the
    allocator and the faiss build by more than that)."""
    out = subprocess.run(
        [sys.executable, "-c", LOAD, root], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def replica_rss_mib() -> float | None:
    """The search replica's resident set (its process title names its deployment)."""
    import psutil

    for p in psutil.process_iter(["cmdline", "memory_info"]):
        if "ServeReplica:cpr-search:search" in " ".join(p.info["cmdline"] or []):
            return p.info["memory_info"].rss / 2**20
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-ongoing", type=int, default=2)
    ap.add_argument("--max-queued", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "idx")
        synthetic_index(args.papers, root, bm25=True)  # under MiniLM's record: real queries
        manifest = json.loads(Path(join(root, "index.json")).read_text())
        dense_only = os.path.join(tmp, "dense-only")  # the same index, its manifest without BM25
        shutil.copytree(root, dense_only)
        Path(join(dense_only, "index.json")).write_text(json.dumps({**manifest, "bm25": None}))
        hybrid_mem, dense_mem = index_memory(root), index_memory(dense_only)
        print(
            f"index in one process ({args.papers:,} papers): resident set after loading it, "
            f"dense only {dense_mem['rss_mib']:.0f} MiB, with BM25 {hybrid_mem['rss_mib']:.0f} "
            f"MiB; the BM25 side alone (tracemalloc) {hybrid_mem['bm25_mib']:.0f} MiB"
        )
        port = free_port()
        log = open(os.path.join(tmp, "serve.log"), "w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cpr_ray.cpr_command",
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
            for retriever in ("dense", "hybrid"):
                for name, clients in (("one client", 1), ("below the limit", args.max_ongoing)):
                    stats = phase(url, clients, args.seconds, retriever)
                    report(f"{retriever}: {name}", clients, *stats)
            print(f"  search replica's resident set: {replica_rss_mib() or float('nan'):.0f} MiB")
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
