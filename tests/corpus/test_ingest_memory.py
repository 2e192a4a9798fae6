"""A parse task's memory is bounded by `ingest.parse_buffer_mb`, not by its shard: a shard larger
than the whole allowance is parsed in a process of its own and its peak resident memory held to
what the task declares to Ray; the files it writes hold the very rows of a parse in one piece."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pytest

from cpr_ray.config import load_config
from cpr_ray.corpus import records
from cpr_ray.corpus.parse_buffer import MIB, line_batch_bytes, parse_task_memory, working_memory
from cpr_ray.corpus.parsing import ParseRecords, ParseShard
from cpr_ray.corpus.shards import LINES, ReadShards, read_shard
from cpr_ray.errors import ConfigError
from cpr_ray.storage.store import Storage
from cpr_ray.tables.buckets import BUCKET, write_partitions

REPO = Path(__file__).resolve().parents[2]
SAMPLE_PAPERS = REPO / "cpr_ray/sample/data/s2/papers"
BUDGET_MB, BUCKETS = 8, 4


def _cfg(root: Path, *overrides: str):
    return load_config("dry-run", overrides=[f"storage.root={root}", *overrides], env={})


def _status_bytes(field: str) -> int:
    """`VmRSS` (resident now) or `VmHWM` (its peak) of this process, from /proc. Not
    `getrusage`'s `ru_maxrss`: Linux carries that across exec from the forked parent, so a
    child of a 1.3 GB test worker reported 1.3 GB before parsing a line."""
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith(f"{field}:"))
    return int(line.split()[1]) * 1024


def _parse_in_this_process(shard: str, root: str) -> None:
    """The child: one parse task's work as Ray runs it (`ParseShard`, at the settings of the
    dry-run profile but for the budget), and its resident memory before and at its peak."""
    cfg = _cfg(Path(root), f"ingest.num_buckets={BUCKETS}", f"ingest.parse_buffer_mb={BUDGET_MB}")
    step = ParseRecords(records.SPECS["abstracts"], BUCKETS, cfg.ingest.raw_line_limit)
    step(LINES.empty_table())  # DuckDB loaded, as in a worker that has parsed before
    idle = _status_bytes("VmRSS")
    reader = ReadShards(Storage(cfg.storage))
    budget = cfg.ingest.parse_buffer_mb * MIB
    ParseShard((shard,), reader, step, f"{root}/staging", cfg.ingest.batch_size, budget)(0)
    peak = _status_bytes("VmHWM")
    print(json.dumps({"idle": idle, "peak": peak}))


def _long_abstracts(path: Path, n_lines: int, chars: int) -> None:
    """Abstracts of `chars` characters (S2ORC-like long lines: DuckDB's working memory per
    batch grows with line length, so they are the hard case)."""
    words = " ".join(f"w{i % 997:03d}x" for i in range(chars // 6 + 1))[:chars]
    with path.open("w") as f:
        for i in range(n_lines):
            f.write(
                f'{{"corpusid":{i + 1},"openaccessinfo":{{"license":"CCBY"}},'
                f'"abstract":"{words} {i}","updated":"2025-10-10T17:16:08.811Z"}}\n'
            )


def test_parse_memory_stays_within_the_declared_bound_on_a_shard_larger_than_it(tmp_path):
    """The shard's lines outweigh the whole allowance (a fifth more than `working_memory`), so
    a parse that held them, or their rows, at once would pass it: only a parse bounded by its
    budget stays under. Abstract-length lines (~1 kB) parse at ~70 MB/s, a few seconds."""
    budget = BUDGET_MB * MIB
    allowance = working_memory(budget)
    chars = 1_000
    n_lines = math.ceil(1.2 * allowance / chars)
    shard = tmp_path / "abstracts-0000.jsonl"
    _long_abstracts(shard, n_lines, chars)
    assert shard.stat().st_size > 1.2 * allowance
    child = [sys.executable, "-m", "tests.corpus.test_ingest_memory", str(shard), str(tmp_path)]
    done = subprocess.run(child, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    mem = json.loads(done.stdout.strip().splitlines()[-1])

    buckets = sorted((tmp_path / "staging").iterdir())  # `_bucket=j`: one folder per bucket
    files = [f for b in buckets for f in b.iterdir()]
    assert pds.dataset(files, format="parquet").count_rows() == n_lines  # every line kept
    # held to the budget: the peak above the idle worker (a parse holding the shard's rows
    # peaks more than the shard above it), and the peak itself within what the task declares
    assert mem["peak"] - mem["idle"] <= allowance
    assert mem["peak"] <= parse_task_memory(budget)
    # a flush writes one file per bucket: the file count follows the budget, not the rows
    flushes = math.ceil(shard.stat().st_size / budget)
    assert BUCKETS <= len(files) <= (BUCKETS + 2) * (flushes + 1)


def _bucket_rows(folder: Path) -> dict[str, list[str]]:
    """Each bucket folder's rows, as sorted JSON (the order of rows in a bucket carries
    nothing)."""
    return {
        d.name: sorted(
            json.dumps(r, sort_keys=True, default=str)
            for r in pds.dataset(d, format="parquet").to_table().to_pylist()
        )
        for d in sorted(folder.iterdir())
    }


@pytest.mark.parametrize("name", ["papers-0000.jsonl.gz", "papers-9999-malformed.jsonl.gz"])
def test_flushing_by_bytes_writes_the_rows_of_one_whole_parse(tmp_path, name):
    """A budget far below the shard (a flush after every batch of 400 lines) gives, bucket by
    bucket, the rows that writing the whole shard's parse at once gives — rejects included."""
    storage = Storage(_cfg(tmp_path).storage)
    shard = str(SAMPLE_PAPERS / name)
    step = ParseRecords(records.SPECS["papers"], BUCKETS, 20_000)
    whole = step(pa.concat_tables(read_shard(storage, shard)))
    write_partitions(whole, str(tmp_path / "whole"), storage, "0")

    ParseShard((shard,), ReadShards(storage), step, str(tmp_path / "flushed"), 400, 1)(0)

    assert _bucket_rows(tmp_path / "flushed") == _bucket_rows(tmp_path / "whole")
    flushes = math.ceil(whole.num_rows / 400)
    for bucket in (tmp_path / "flushed").iterdir():
        names = sorted(f.name for f in bucket.iterdir())
        assert len(names) <= flushes and all(n.startswith("part-00000-") for n in names)
    kept = whole.filter(pc.greater_equal(whole[BUCKET], 0)).num_rows
    if kept > 400:  # a bucket's rows went out in several flushes, one file each
        assert max(len(list(b.iterdir())) for b in (tmp_path / "flushed").iterdir()) > 1


def test_parse_budget_fits_the_cluster_and_refuses_tiny_files(tmp_path):
    cfg = load_config("cluster", overrides=[f"storage.root={tmp_path}"], env={})
    declared = parse_task_memory(cfg.ingest.parse_buffer_mb * MIB)
    # a cpu_worker (m6i.4xlarge, 64 GiB, 16 CPUs): Ray offers ~70% of the ~60 GiB free when it
    # starts as task memory, and every CPU should be able to run a parse task
    assert 16 * declared <= 0.7 * 60 * 1024 * MIB
    # abstracts (~2 kB a line) go to DuckDB an eighth of the budget at a time; S2ORC documents
    # (~60 kB), whose 2,048-row vectors alone would take ~2.5 GB there, a 32nd
    budget = cfg.ingest.parse_buffer_mb * MIB
    assert line_batch_bytes(budget, 2_000) == budget // 8
    assert line_batch_bytes(budget, 60_000) == budget // 32
    tiny = r"parse_buffer_mb=64 with num_buckets=256 .* at least 258"
    with pytest.raises(ConfigError, match=tiny):
        load_config("cluster", overrides=["ingest.parse_buffer_mb=64"], env={})


if __name__ == "__main__":
    _parse_in_this_process(sys.argv[1], sys.argv[2])
