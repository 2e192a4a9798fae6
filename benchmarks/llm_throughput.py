"""LLM actor throughput against an endpoint with fixed latency, as a share of the in-flight bound.

Candidate: `cpr_ray.llm.step_runner.ask_pool`, the stage's own path for its rows (blocks cut per
batch, one pool of async `LLMActor`s, answers made durable as they arrive). Endpoint: the
scripted OpenAI-compatible server (tests/standins/scripted_llm.py) on loopback with a fixed
injected latency and no token cost. The named baseline is the ideal: requests in flight ÷
latency. Two scenarios, each in the same run:

  bound   one `LLMActor` pool (default 1 actor × 64 in flight, 10,000 rows, 200 ms);
  faults  512 in flight over 4 actors, with 1% of requests answered 429 (Retry-After 1 s) and
          1% 500 at random; every row must end `ok`, `invalid` or `failed`, none lost.

Each prints rows/s over the whole run (the actor pool's start included; Ray Data's one-time
set-up in the process is paid before timing, as earlier stages pay it in a build), its share of
the bound, and CPU milliseconds per request of the actor processes and of the scripted server,
read from the kernel's process accounting: an actor is CPU-bound on a slow core, so the share
alone does not travel between machines, while ms/request does. `--ray-data-llm` adds
`ray.data.llm`'s HTTP processor at the same concurrency (slow: minutes). Usage:

    python benchmarks/llm_throughput.py [--rows 10000] [--latency-ms 200] [--in-flight 64]
        [--actors 1] [--fault-rows 20000] [--skip-faults] [--ray-data-llm]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow as pa
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.*

from cpr_ray.config import LLMConfig  # noqa: E402
from cpr_ray.llm.asking import ask_pool  # noqa: E402
from cpr_ray.llm.spend_ledger import AnswerSink  # noqa: E402
from cpr_ray.llm.task import KEY  # noqa: E402
from cpr_ray.queries.usefulness import UsefulnessGrader  # noqa: E402
from cpr_ray.storage.store import StorageConfig  # noqa: E402
from tests.standins.clients import ScriptedLLM, start_scripted_llm  # noqa: E402  (the scripted endpoint)


def rows(n: int) -> pa.Table:
    return pa.table(
        {
            "query": [f"how to do thing {i}?" for i in range(n)],
            "passage": [f"passage {i}" for i in range(n)],
            "mappings": [""] * n,
            KEY: [str(i) for i in range(n)],
        }
    )


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


class ActorCPU:
    """CPU seconds of the Ray processes running `LLMActor`, sampled until they exit. Counted from
    the first sample of each process, so the pre-started worker's own start is left out."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            for proc in psutil.process_iter(["cmdline"]):
                if "LLMActor" not in " ".join(proc.info["cmdline"] or ()):
                    continue
                try:
                    cpu = _cpu_s(proc)
                except psutil.Error:
                    continue
                self.first.setdefault(proc.pid, cpu)
                self.last[proc.pid] = cpu
            self._stop.wait(0.2)

    def __enter__(self) -> ActorCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)


def ours(
    llm: ScriptedLLM,
    server: psutil.Process,
    table: pa.Table,
    *,
    actors: int,
    in_flight: int,
    latency_ms: float,
    fault_rates: dict[str, float] | None = None,
) -> dict:
    cfg = LLMConfig(model="scripted", max_in_flight=in_flight, actors=actors, max_retries=3)
    root = tempfile.mkdtemp(prefix="cpr-bench-llm-")
    # answers are made durable as they arrive, as in a stage: that work is part of the figure
    sink = AnswerSink(StorageConfig(root=root), f"{root}/cache", f"{root}/ledger", "bench")
    llm.reset()
    llm.latency(latency_ms)
    if fault_rates:
        llm.fault_rates(seed=0, **fault_rates)
    server_cpu = _cpu_s(server)
    wall, started = time.time(), time.perf_counter()
    with ActorCPU() as actor_cpu:
        # the stage's own path: blocks, one actor pool, batches, durable answers
        task = UsefulnessGrader()
        with ask_pool(task, cfg, table, base_url=llm.base_url, limiter=None, sink=sink) as blocks:
            out = pa.concat_tables(list(blocks))
        seconds = time.perf_counter() - started
    n = table.num_rows
    arrivals = llm.stats()["arrivals"]
    return {
        "first_request_s": arrivals[0] - wall,
        "window_rows_per_s": len(arrivals) / (arrivals[-1] - arrivals[0] + latency_ms / 1000),
        "seconds": seconds,
        "rows_per_s": n / seconds,
        "statuses": Counter(out["status"].to_pylist()),
        "lost": len(set(table[KEY].to_pylist()) - set(out[KEY].to_pylist())),
        "retries": sum(out["retries"].to_pylist()),
        "actor_ms": 1000 * actor_cpu.seconds / n,
        "server_ms": 1000 * (_cpu_s(server) - server_cpu) / n,
    }


def ray_llm(base_url: str, table: pa.Table, actors: int, in_flight: int) -> float:
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    config = HttpRequestProcessorConfig(
        url=f"{base_url}/chat/completions",
        headers={"Content-Type": "application/json"},
        batch_size=in_flight,
        concurrency=actors,
        max_retries=3,
    )
    processor = build_processor(
        config,
        preprocess=lambda row: {
            "payload": {
                "model": "scripted",
                "messages": [
                    {
                        "role": "user",
                        "content": f"Question: {row['query']}\nPassage: {row['passage']}",
                    }
                ],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "Usefulness", "schema": {}},
                },
            }
        },
        postprocess=lambda row: {
            "answer": row["http_response"]["choices"][0]["message"]["content"]
        },
    )
    started = time.perf_counter()
    n = processor(ray.data.from_arrow(table.select(["query", "passage"]))).count()
    seconds = time.perf_counter() - started
    assert n == table.num_rows
    return seconds


def report(name: str, r: dict, n: int, latency_ms: float, actors: int, in_flight: int) -> float:
    ideal = actors * in_flight / (latency_ms / 1000)
    share = r["rows_per_s"] / ideal
    print(
        f"\n[{name}] {n:,} rows, {latency_ms:.0f} ms latency, {actors} actor(s) × {in_flight} in "
        f"flight"
    )
    print(f"  ideal bound (in flight ÷ latency): {ideal:9.1f} rows/s")
    print(
        f"  cpr-ray LLMActor:                  {r['rows_per_s']:9.1f} rows/s  {share:.2f} of the "
        f"bound  ({r['seconds']:.1f} s, actor start included)"
    )
    print(
        f"  first request {r['first_request_s']:.1f} s after the start (actor start); from then "
        f"on {r['window_rows_per_s']:.1f} requests/s"
    )
    print(
        f"  CPU per request: actor {r['actor_ms']:.2f} ms, scripted server {r['server_ms']:.2f} ms"
    )
    statuses = ", ".join(f"{k} {v:,}" for k, v in sorted(r["statuses"].items()))
    print(f"  rows: {statuses}; lost {r['lost']:,}; HTTP retries {r['retries']:,}")
    return share


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument("--fault-rows", type=int, default=20_000)
    parser.add_argument("--skip-faults", action="store_true")
    parser.add_argument("--ray-data-llm", action="store_true", help="also time ray.data.llm")
    args = parser.parse_args(argv)

    proc, llm = start_scripted_llm(Path("/tmp/cpr-llm-bench-server.log"))
    server = psutil.Process(proc.pid)
    try:
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, object_store_memory=512 * 1024**2)
        ray.data.DataContext.get_current().enable_progress_bars = False
        # Ray Data's first use in a process sets up its executor (~1 s here); in a build that
        # is paid by earlier stages, so it is paid here before timing, by a trivial task
        ray.data.range(2).map_batches(lambda b: b).take_all()
        table = rows(args.rows)
        r = ours(
            llm,
            server,
            table,
            actors=args.actors,
            in_flight=args.in_flight,
            latency_ms=args.latency_ms,
        )
        assert r["statuses"]["ok"] == args.rows and not r["lost"], r
        report("bound", r, args.rows, args.latency_ms, args.actors, args.in_flight)
        if not args.skip_faults:
            f = ours(
                llm,
                server,
                rows(args.fault_rows),
                actors=4,
                in_flight=128,
                latency_ms=args.latency_ms,
                fault_rates={"429": 0.01, "500": 0.01},
            )
            report("faults: 1% 429 + 1% 500", f, args.fault_rows, args.latency_ms, 4, 128)
            ended = sum(f["statuses"][s] for s in ("ok", "invalid", "failed"))
            print(
                f"  every row ended ok/invalid/failed: {ended == args.fault_rows and not f['lost']}"
            )
        if args.ray_data_llm:
            llm.reset()
            llm.latency(args.latency_ms)
            t_ray = ray_llm(llm.base_url, table, args.actors, args.in_flight)
            ideal = args.actors * args.in_flight / (args.latency_ms / 1000)
            print(
                f"\n[ray.data.llm HTTP processor] {args.rows / t_ray:9.1f} rows/s  "
                f"{args.rows / t_ray / ideal:.2f} of the bound ({t_ray:.1f} s); cpr-ray is "
                f"{t_ray / r['seconds']:.1f}x faster"
            )
    finally:
        proc.terminate()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
