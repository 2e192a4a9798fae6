"""Candidate pooling throughput: the `pool` stage over a synthetic universe with three poolers.

A synthetic build is published the way the upstream stages publish theirs (ingest's papers as
Lance, mine's universe, judge-analogy's judged pairs, score-positives' positives, with
manifests): `--papers` papers over 300 OpenAlex-like topics, titles and ~120-word abstracts whose
words lean to their topics, dates 1990–2024, and `--queries` positives (a base paper from 2010 on
and a positive from other topics published before it) with a few rejected citations each.

The three poolers are one of each kind: dense (a randomly initialised 1-layer BERT, hidden 128,
mean pooling, on MiniLM's tokenizer), SPLADE (the same shape with its masked-LM head, its output
bias set so that a text keeps ~1% of the vocabulary, as trained SPLADE models do) and BM25. By
default the document vectors are prefilled into the embedding stores under the keys the stage
computes (random unit vectors; each paper's own terms for SPLADE), as a rerun or a refresh finds
them, so the run measures the pooling — query encoding, search, merge — not the encoders, which
`benchmarks/encode.py` measures; `--encode` lets the stage encode them too (slow on a CPU:
SPLADE's vocabulary-sized head). Printed: seconds per phase, and queries per second of the
search and merge phases (actor start and index load included). Usage:

    python benchmarks/pool.py [--papers 100000] [--queries 2000] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from random_bert import random_bert  # noqa: E402  (this folder)

from cpr_ray.config import Config, load_config, minilm_dir  # noqa: E402
from cpr_ray.pooling.embeddings import vector_store  # noqa: E402
from cpr_ray.pooling.pool_rules import doc_text  # noqa: E402
from cpr_ray.pooling.pool_stage import pool  # noqa: E402
from cpr_ray.pooling.poolers import plans  # noqa: E402
from cpr_ray.retrieval.vector_store import text_keys  # noqa: E402
from cpr_ray.runs.stage_runner import manifest_uri  # noqa: E402
from cpr_ray.storage.store import Storage, join  # noqa: E402
from cpr_ray.tables.buckets import BucketLayout  # noqa: E402
from cpr_ray.tables.schemas import PAPERS  # noqa: E402

TOPICS = 300
WORDS_PER_TOPIC = 40


def vocabulary() -> tuple[np.ndarray, np.ndarray]:
    """Whole lower-case words of MiniLM's WordPiece vocabulary (one token each), and their token
    ids."""
    lines = (minilm_dir() / "vocab.txt").read_text().splitlines()
    ids = np.array([i for i, w in enumerate(lines) if w.isalpha() and w.islower() and len(w) >= 4])
    return np.array(lines)[ids], ids


def synthetic_world(papers: int, queries: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    vocab, token_ids = vocabulary()
    topic_words = rng.choice(len(vocab), (TOPICS, WORDS_PER_TOPIC))
    n_topics = rng.integers(1, 4, papers)
    topics = [rng.choice(TOPICS, k, replace=False) for k in n_topics]
    texts, tokens = [], []
    for ts in topics:  # benchmark set-up: 60% of the words from the paper's topics
        own = topic_words[ts].ravel()
        words = np.where(
            rng.random(128) < 0.6, rng.choice(own, 128), rng.integers(0, len(vocab), 128)
        )
        texts.append(vocab[words])
        tokens.append(np.unique(token_ids[words]))
    days = rng.integers(
        (dt.date(1990, 1, 1) - dt.date(1970, 1, 1)).days,
        (dt.date(2024, 12, 31) - dt.date(1970, 1, 1)).days,
        papers,
    )
    ids = np.arange(papers, dtype=np.int64) * 13 + 1_000_000
    columns = {
        "corpus_id": ids,
        "title": [" ".join(w[:8]) for w in texts],
        "abstract": [" ".join(w[8:]) for w in texts],
        "abstract_length": [600] * papers,
        "year": [int(1970 + d // 365.25) for d in days],
        "publication_date": pa.array(days.astype(np.int32), pa.int32()).cast(pa.date32()),
        "topics": pa.array(
            [[{"id": int(t), "name": f"topic {t}", "score": 1.0} for t in ts] for ts in topics],
            PAPERS.field("topics").type,
        ),
        "field": ["Field"] * papers,
        "domain": ["Domain"] * papers,
    }
    table = pa.table({f.name: columns.get(f.name, pa.nulls(papers, f.type)) for f in PAPERS}).cast(
        PAPERS
    )
    recent = np.flatnonzero(days >= (dt.date(2010, 1, 1) - dt.date(1970, 1, 1)).days)
    bases = rng.choice(recent, queries, replace=False)
    rows, judged = [], []
    for b in bases:
        older = rng.choice(np.flatnonzero(days < days[b]), 8, replace=False)
        disjoint = [o for o in older if not set(topics[o]) & set(topics[b])] or [older[0]]
        p = disjoint[0]
        query = "how to " + " ".join(vocab[rng.choice(topic_words[topics[b]].ravel(), 14)])
        rows.append(
            {
                "query": query,
                "base_id": ids[b],
                "cited_id": ids[p],
                "base_field": "Field",
                "base_domain": "Domain",
                "cited_field": "Other",
                "cited_domain": "Domain",
                "crosses_field": True,
                "crosses_domain": False,
            }
        )
        judged.append(
            {"base_id": ids[b], "cited_id": ids[p], "status": "ok", "decision": "observed_analogy"}
        )
        judged += [
            {"base_id": ids[b], "cited_id": ids[o], "status": "ok", "decision": "not_analogy"}
            for o in older[1:4]
            if o != p
        ]
    return {
        "papers": table,
        "universe": pa.table({"corpus_id": ids}),
        "positives": pa.Table.from_pylist(rows),
        "judged": pa.Table.from_pylist(judged),
        "tokens": tokens,  # each paper's distinct token ids: its prefilled SPLADE terms
    }


def publish(storage: Storage, world: dict) -> None:
    """The upstream stages' tables and manifests, as pool reads them."""
    upstream = {
        "papers": ("ingest", "lance"),
        "universe": ("mine", "parquet"),
        "judged": ("judge-analogy", "parquet"),
        "positives": ("score-positives", "parquet"),
    }
    for name, (stage, fmt) in upstream.items():
        uri = join(storage.root, stage, "runs", "0", f"{name}.{fmt}")
        table: dict = {"uri": uri, "format": fmt, "rows": world[name].num_rows}
        if fmt == "lance":
            written = lance.write_dataset(world[name], uri, max_rows_per_file=25_000)
            # one key bucket: the pool stage reads the whole table in one task
            layout = BucketLayout("corpus_id", 1, {}).as_dict()
            table.update(version=written.version, layout=layout)
        elif name == "universe":  # mine writes it in the papers' key buckets (here one)
            uri = table["uri"] = join(storage.root, stage, "runs", "0", name)
            storage.write_parquet(world[name], join(uri, "part-00000.parquet"))
        else:
            storage.write_parquet(world[name], uri)
        storage.write_json(
            manifest_uri(storage, stage),
            {"stage": stage, "run_id": "0", "complete": True, "tables": {name: table}},
        )


def prefill_store(storage: Storage, cfg: Config, world: dict, dim: int) -> None:
    """Document vectors of every encoding pooler in its embedding store, under the keys the
    stage computes, as a rerun finds them: random unit vectors (dense) and each paper's own
    terms (SPLADE). The stage then encodes nothing and the run measures the pooling."""
    papers = world["papers"]
    rng = np.random.default_rng(1)
    for plan in plans(cfg.pooling):
        if plan.spec is None:
            continue
        text = doc_text(papers["title"], papers["abstract"], plan.template)
        columns = {"corpus_id": papers["corpus_id"], "key": text_keys(text, papers["corpus_id"])}
        if plan.kind == "dense":
            vectors = rng.standard_normal((papers.num_rows, dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            flat = pa.array(vectors.ravel(), pa.float32())
            columns["embedding"] = pa.FixedSizeListArray.from_arrays(flat, dim)
        else:
            terms = world["tokens"]
            offsets = pa.array(
                np.concatenate([[0], np.cumsum([len(t) for t in terms])]), pa.int32()
            )
            flat = np.concatenate(terms)
            columns["indices"] = pa.ListArray.from_arrays(offsets, pa.array(flat, pa.int32()))
            weights = pa.array(np.ones(len(flat), np.float32))
            columns["values"] = pa.ListArray.from_arrays(offsets, weights)
        storage.write_parquet(
            pa.table(columns), join(vector_store(storage, plan).uri, "prefilled.parquet")
        )


def tiny_models(folder: Path) -> dict[str, str]:
    """A random 1-layer BERT (dense, mean pooling) and its masked-LM twin, biased sparse."""
    import torch
    from transformers import BertForMaskedLM, BertModel

    tok, config = random_bert(hidden=128, heads=2, intermediate=256)
    dense, splade = folder / "dense-tiny", folder / "splade-tiny"
    BertModel(config).save_pretrained(dense)
    mlm = BertForMaskedLM(config)
    with torch.no_grad():
        sample = tok(["a sample sentence about proteins and markets"], return_tensors="pt")
        logits = mlm(**sample).logits  # (1, L, V)
        mlm.cls.predictions.bias -= torch.quantile(logits.flatten(), 0.9999)
    mlm.save_pretrained(splade)
    for path in (dense, splade):
        tok.save_pretrained(path)
    return {"dense": str(dense), "splade": str(splade)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--papers", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--out", default=None, help="build root (default: a temporary folder)")
    ap.add_argument(
        "--shard-vectors",
        type=int,
        default=None,
        help="pooling.shard_vectors: papers per shard of the universe (default: the config's)",
    )
    ap.add_argument(
        "--encode",
        action="store_true",
        help="let the stage encode the documents (default: prefilled embedding stores)",
    )
    args = ap.parse_args()
    import ray

    root = Path(args.out or tempfile.mkdtemp(prefix="cpr-bench-pool-"))
    models = tiny_models(root / "models")
    encoder = "max_length: 128, batch_size: 64, device: cpu, actors: 2"
    poolers = (
        f"[{{name: dense, kind: dense, encoder: {{model: '{models['dense']}', {encoder}}}}}, "
        f"{{name: splade, kind: splade, encoder: {{model: '{models['splade']}', {encoder}}}}}, "
        "{name: bm25, kind: bm25, doc_template: '{title} {abstract}'}]"
    )
    cfg = load_config(
        "dry-run",
        env={},
        overrides=[
            f"storage.root={root / 'build'}",
            f"pooling.poolers={poolers}",
            "pooling.min_group_size=50",
            "pooling.search_actors=2",
            *([f"pooling.shard_vectors={args.shard_vectors}"] if args.shard_vectors else []),
        ],
    )
    storage = Storage(cfg.storage)
    started = time.perf_counter()
    world = synthetic_world(args.papers, args.queries)
    publish(storage, world)
    if not args.encode:
        prefill_store(storage, cfg, world, dim=128)
    print(
        f"synthetic build: {args.papers:,} papers, {args.queries:,} queries "
        f"({time.perf_counter() - started:.0f} s)"
    )

    ray.init(
        num_cpus=2,
        num_gpus=0,
        include_dashboard=False,
        object_store_memory=1024 * 1024**2,
        _temp_dir=tempfile.mkdtemp(prefix="cprb-", dir=os.environ.get("RAY_TMPDIR", "/tmp")),
    )
    started = time.perf_counter()
    m = pool(cfg, storage, force=True)
    wall = time.perf_counter() - started
    stats = m["stats"]
    seconds = stats["phase_seconds"]
    searched = sum(seconds.get(p, 0) for p in ("search", "merge", "search_short", "merge_short"))
    print(json.dumps({k: stats[k] for k in ("candidates_per_group", "poolers")}, indent=1))
    print(f"phases: {seconds}")
    print(
        f"pool stage: {wall:.0f} s for {stats['queries']:,} queries over "
        f"{stats['universe']:,} papers, {stats['candidates']:,} candidates"
    )
    print(
        f"pooling (search + merge, 3 poolers): {searched:.1f} s, "
        f"{stats['queries'] / searched:.1f} queries/s "
        f"({stats['queries_pooled_deeper']:,} pooled again at top_k_short)"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
