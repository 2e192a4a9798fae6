"""LLM throughput against an endpoint with fixed latency: our judge actors vs ray.data.llm.

Endpoint: the scripted OpenAI-compatible server (tests/scripted_llm.py) on loopback with a fixed
injected latency and no token cost. Measured, with the same number of actors:
  (a) our `LLMActor` (async client, semaphore of `--in-flight` requests per actor),
  (b) `ray.data.llm` with `HttpRequestProcessorConfig` (its HTTP stage, same concurrency),
  (c) the ideal bound: requests in flight ÷ latency.
Prints rows/s of each and their ratios to the ideal. Usage:

    python benchmarks/llm_throughput.py [--rows 10000] [--latency-ms 200] [--in-flight 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import start_scripted_llm  # noqa: E402  (the scripted endpoint lives with tests)

from cpr_ray.config import LLMConfig, StorageConfig  # noqa: E402
from cpr_ray.llm.judges import UsefulnessGrader  # noqa: E402
from cpr_ray.llm.runner import ACTOR_CPUS, KEY, AnswerSink, LLMActor  # noqa: E402


def rows(n: int) -> pa.Table:
    return pa.table(
        {
            "query": [f"how to do thing {i}?" for i in range(n)],
            "passage": [f"passage {i}" for i in range(n)],
            "mappings": [""] * n,
            KEY: [str(i) for i in range(n)],
        }
    )


def ours(base_url: str, table: pa.Table, actors: int, in_flight: int) -> float:
    cfg = LLMConfig(model="scripted", max_in_flight=in_flight, actors=actors, max_retries=3)
    root = tempfile.mkdtemp(prefix="cpr-bench-llm-")
    # answers are made durable as they arrive, as in a stage: that work is part of the figure
    sink = AnswerSink(StorageConfig(root=root), f"{root}/cache", f"{root}/ledger", "bench")
    started = time.perf_counter()
    ds = ray.data.from_arrow(table).map_batches(
        LLMActor,
        fn_constructor_kwargs={
            "task": UsefulnessGrader(),
            "llm": cfg,
            "base_url": base_url,
            "limiter": None,
            "sink": sink,
        },
        compute=ray.data.ActorPoolStrategy(size=actors),
        batch_size=in_flight * 2,
        batch_format="pyarrow",
        num_cpus=ACTOR_CPUS,
    )
    out = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    seconds = time.perf_counter() - started
    ok = sum(1 for s in out["status"].to_pylist() if s == "ok")
    assert ok == table.num_rows, f"only {ok} of {table.num_rows} answered"
    return seconds


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--actors", type=int, default=1)
    args = parser.parse_args(argv)

    proc, llm = start_scripted_llm(Path("/tmp/cpr-llm-bench-server.log"))
    try:
        llm.latency(args.latency_ms)
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, object_store_memory=512 * 1024**2)
        table = rows(args.rows)
        ideal_rps = args.actors * args.in_flight / (args.latency_ms / 1000)
        t_ours = ours(llm.base_url, table, args.actors, args.in_flight)
        t_ray = ray_llm(llm.base_url, table, args.actors, args.in_flight)
        rps_ours, rps_ray = args.rows / t_ours, args.rows / t_ray
        print(
            f"\n{args.rows:,} rows, {args.latency_ms:.0f} ms latency, {args.actors} actor(s) × "
            f"{args.in_flight} in flight"
        )
        print(f"(c) ideal bound:                  {ideal_rps:9.1f} rows/s")
        print(
            f"(a) cpr-ray LLMActor:             {rps_ours:9.1f} rows/s  "
            f"{rps_ours / ideal_rps:.2f} of ideal  ({t_ours:.1f} s)"
        )
        print(
            f"(b) ray.data.llm HTTP processor:  {rps_ray:9.1f} rows/s  "
            f"{rps_ray / ideal_rps:.2f} of ideal  ({t_ray:.1f} s)"
        )
        print(f"ratio (a)/(b): {rps_ours / rps_ray:.1f}x")
    finally:
        proc.terminate()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
