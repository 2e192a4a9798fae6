"""The `cpr index` driver's memory: how much its peak resident set grows while it builds an index.

A synthetic export of `--docs` papers is indexed with a tiny randomly initialised BERT of hidden
size `--dim` (MiniLM's tokenizer; one layer, so encoding is quick on a laptop and the vectors are
wide enough to show in the driver's memory), on a local Ray with two encoder actors. Printed: the
driver's resident set before `build_index`, its peak during it, and the growth; the bytes of the
index's vectors for scale. The driver's peak should not grow with the vectors (they stream from
the encoder actors to storage and are assembled a chunk at a time).

    python benchmarks/index_memory.py [--docs 5000] [--dim 2048] [--shard-size 2000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from random_bert import save_random_bert  # noqa: E402  (this folder)

from cpr_ray.config import load_config  # noqa: E402
from cpr_ray.dataset.format import CORPUS  # noqa: E402

WORDS = (
    "neural network protein gene market price quantum entropy auction graph enzyme lattice "
    "diffusion inflation compiler genome portfolio galaxy classifier equilibrium"
).split()


def export(folder: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    rows = [
        {
            "corpus_id": 1000 + 3 * i,
            "title": " ".join(rng.choice(WORDS, 5)),
            "abstract": "We study " + " and ".join(rng.choice(WORDS, 30)) + f" in setting {i}.",
            "abstract_license": "CC-BY",
            "year": 1990 + i % 35,
            "publication_date": None,
            "topics": [],
            "field": f"Field {i % 20}",
            "domain": "Physical Sciences",
        }
        for i in range(n)
    ]
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=CORPUS), folder / "corpus.parquet")
    return folder


def status_mb(key: str) -> float:
    """VmRSS (resident now) or VmHWM (its peak) of this process, in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--shard-size", type=int, default=2000)
    args = parser.parse_args()

    import ray

    from cpr_ray.search.sharded_index import build_index

    tmp = Path(tempfile.mkdtemp(prefix="index-memory-"))
    corpus = export(tmp / "export", args.docs)
    model = save_random_bert(
        tmp / "model", hidden=args.dim, heads=8, intermediate=64, max_positions=128
    )
    cfg = load_config(
        flags={
            "search.corpus": str(corpus),
            "search.out": str(tmp / "index"),
            "search.shard_size": args.shard_size,
            "encoder.model": str(model),
            "encoder.max_length": 64,
            "encoder.device": "cpu",
        }
    )
    ray.init(num_cpus=2, num_gpus=0, object_store_memory=256 * 1024**2, include_dashboard=False)
    Path("/proc/self/clear_refs").write_text("5")  # the peak so far (making the model) goes
    before = status_mb("VmRSS")
    manifest = build_index(cfg)
    peak = status_mb("VmHWM")
    ray.shutdown()
    vectors = args.docs * manifest["dim"] * 4 / 2**20
    print(
        f"{args.docs:,} docs, dim {manifest['dim']}, {len(manifest['shards'])} shard(s): "
        f"vectors {vectors:.0f} MiB; driver RSS before {before:.0f} MiB, peak {peak:.0f} MiB, "
        f"growth {peak - before:.0f} MiB"
    )


if __name__ == "__main__":
    main()
