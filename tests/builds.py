"""What many tests share about the bundled sample and its builds: where the real records are, the
sample's S2 releases, the settings of a quick build, and copies of a build a test may change."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from cpr_ray.mining import reference as whole_table
from cpr_ray.mining.mining_sql import PAPER_COLUMNS
from tests.standins.launch import free_port

if TYPE_CHECKING:
    from tests.standins.clients import ScriptedLLM


# Real records the tests read. Those that may be redistributed are in the repository: S2's
# sample rows (tests/data/s2-samples, ODC-BY) and OpenAlex works (the bundled sample, CC0).
# AnaloBench (research use) is not: its tests skip unless the team's reference folder beside the
# checkout holds it.
S2_SAMPLES = Path(__file__).resolve().parent / "data" / "s2-samples"
OPENALEX_SAMPLE = (
    Path(__file__).resolve().parents[1]
    / "cpr_ray/sample/data/openalex/works/updated_date=2026-03-01/part_0000.gz"
)
ANALOBENCH = Path(__file__).resolve().parents[2] / "shared" / "reference" / "analobench"
ANALOBENCH_FILES = ("AnaloBench-T2-Base.csv", "clusters.tsv", "stories-10.csv", "stories-30.csv")


# the sample's S2 release, and the one a test's diff moves it to
OLD, NEW = "2026-11-25", "2026-12-02"


def small_build(llm_url: str | None, max_rows: int | None = 8) -> list[str]:
    """`--set` overrides for a quick build on the sample: the scripted endpoint at `llm_url`
    (None: the dry-run profile's pins answer), at most `max_rows` rows per LLM stage (None: all),
    one BM25 pooler, short pools and one negative per group."""
    return [
        # the dry-run profile's placeholder pins never go to another endpoint
        *([f"llm.base_url={llm_url}", "llm.stages={}"] if llm_url else []),
        "llm.model=scripted",
        "llm.max_in_flight=8",
        f"llm.max_rows_per_stage={'null' if max_rows is None else max_rows}",
        "pooling.poolers=[{name: bm25, kind: bm25}]",
        "pooling.top_k=10",
        "pooling.top_k_short=10",
        "pooling.min_group_size=1",
        "dataset.eval_negatives_per_group=1",
        "dataset.train_negatives_per_group=1",
    ]


REPO = Path(__file__).resolve().parents[1]  # the repository root


@contextmanager
def ray_head_process(
    prefix: str, options: list[str], env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`ray start --head --block` on loopback with `options`, in a temp folder of its own (short:
    Ray's socket paths must fit in 107 characters, which a pytest-xdist worker's tmp path does
    not) and a process group of its own, killed as a group at the end: `ray stop` would stop
    every Ray on this machine, the tests' own included. Yields the process and the folder (its
    head.log)."""
    temp = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("RAY_TMPDIR", "/tmp")))
    ray = str(Path(sys.executable).parent / "ray")
    start = [ray, "start", "--head", "--block", "--node-ip-address=127.0.0.1"]
    start += [f"--dashboard-agent-listen-port={free_port()}", "--num-gpus=0"]
    with open(temp / "head.log", "wb") as log:
        proc = subprocess.Popen(
            [*start, *options, f"--temp-dir={temp}", "--disable-usage-stats"],
            env={**env, "RAY_ADDRESS": ""},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, temp
    finally:
        # the whole group at once: `ray start --block` takes half a minute to stop its children
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


def upload_tree(endpoint: str, bucket: str, local: Path, prefix: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")


def flushed_answers(root: Path, stage: str) -> tuple[int, int]:
    """(valid answers in the stage's cache, rows in its ledger) under a local build `root`: what
    an asker's flushes have stored so far. A flush writes the cache part, then the ledger part,
    each atomically, so a test that will kill the asker waits for both to hold what it expects
    rather than sleeping past the flush interval."""
    import pyarrow.dataset as pds

    def rows(kind: str, only_ok: bool) -> int:
        folder = root / "_llm" / kind / stage
        if not folder.is_dir():
            return 0
        ds = pds.dataset(str(folder), format="parquet")  # skips `_tmp-` parts being written
        return ds.count_rows(filter=pds.field("status") == "ok") if only_ok else ds.count_rows()

    return rows("cache", True), rows("ledger", False)


def assert_equals_whole_table_mining(storage, cfg, manifest) -> None:
    """The stage's base papers, pairs (every column) and universe are exactly those of one
    DuckDB process over the whole tables at the versions the ingest manifest records."""
    tables = storage.read_json(f"{storage.root}/ingest/_MANIFEST.json")["tables"]
    whole = whole_table.mine_whole(
        *whole_table.load_tables(
            tables["papers"]["uri"],
            tables["citations"]["uri"],
            tables["venues"]["uri"],
            versions=(tables["papers"]["version"], tables["citations"]["version"]),
            paper_columns=PAPER_COLUMNS,
        ),
        cfg.mining,
        threads=2,
    )
    base = _read_parquet(storage, manifest["tables"]["base_papers"]["uri"])
    assert sorted(base["corpus_id"].to_pylist()) == sorted(whole.base["corpus_id"].to_pylist())
    assert _read_parquet(storage, manifest["tables"]["pairs"]["uri"]).equals(whole.pairs)
    universe = _read_parquet(storage, manifest["tables"]["universe"]["uri"])["corpus_id"]
    assert sorted(universe.to_pylist()) == whole.universe.to_pylist()
    assert manifest["tables"]["universe"]["rows"] == len(whole.universe)


def _read_parquet(storage, uri):
    loc = storage.resolve(uri)
    return pq.read_table(loc.path, filesystem=loc.fs)


# -- the bundled sample, built once per test process ----------------------------------------------

LLM_STAGES = ["judge-analogy", "judge-transfer", "write-queries", "dedup", "score-positives"]
TO_POSITIVES = ["ingest", "venues", "mine", *LLM_STAGES]


def scripted_config(root: Path | str, llm: ScriptedLLM, *extra: str):
    """The dry-run profile on `root` with the scripted model: the settings the shared positives
    build was made with, so a test's build skips every stage it already holds."""
    from cpr_ray.config import load_config

    return load_config(
        "dry-run",
        env={},
        overrides=[
            f"storage.root={root}",
            f"llm.base_url={llm.base_url}",
            "llm.model=scripted",
            "llm.max_rows_per_stage=12",
            "llm.max_failure_rate=0.2",
            "llm.max_in_flight=8",
            *extra,
        ],
        unpin_for_endpoint=True,  # the scripted model answers for itself, as a real one does
    )


def copy_build(src: Path, dst: Path) -> Path:
    """A copy of a local build root that owns its files: every manifest's URIs are rewritten to
    the copy, so a test that changes a table changes only its own."""
    shutil.copytree(src, dst)
    for manifest in dst.rglob("_MANIFEST.json"):
        manifest.write_text(manifest.read_text().replace(str(src), str(dst)))
    return dst
