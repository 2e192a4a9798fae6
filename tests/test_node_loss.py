"""What each stage does when the node doing its work vanishes, on a real multi-node Ray.

One `ray.cluster_utils.Cluster` serves the whole file: a head with no CPUs (the drivers and
Ray's own services, as on a cluster whose head schedules no work) and two 1-CPU workers that
each offer `cpr_gpu_node`, the custom resource the cluster profile's GPU workers offer. Every
node is its own raylet, object store and worker processes; removing one kills them all at once,
as a reclaimed spot instance is lost. The stages run as a user runs them against a cluster
(`cpr build`, `cpr train`, `cpr serve` with `RAY_ADDRESS`), each in its own driver process,
and the test removes the worker node that holds the stage's work once some of its output
exists, adds a fresh node as an autoscaler would, and compares the end state with an
uninterrupted run's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import pyarrow.dataset as pds
import pytest

from .conftest import ScriptedLLM, copy_build

pytestmark = pytest.mark.node_loss

WORKERS = 2


class LosableCluster:
    """The file's Ray cluster, with the means to lose the node doing some work."""

    def __init__(self, temp_dir: str) -> None:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "object_store_memory": 128 * 1024**2,
                "include_dashboard": False,
                "temp_dir": temp_dir,
            },
        )
        self.address = self.cluster.address
        self.ensure_workers()

    def ensure_workers(self, n: int = WORKERS) -> None:
        """Bring the live workers back to `n` (what a lost node's replacement does)."""
        while len(self.cluster.worker_nodes) < n:
            self.cluster.add_node(
                num_cpus=1, resources={"cpr_gpu_node": 1}, object_store_memory=128 * 1024**2
            )

    @staticmethod
    def _processes(node) -> list[psutil.Process]:
        raylet = node.all_processes["raylet"][0].process.pid
        try:
            return psutil.Process(raylet).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def node_running(self, marker: str) -> object | None:
        """A worker node with a live process whose title holds `marker` (Ray titles a worker
        by what it runs: `ray::MapWorker(MapBatches(LLMActor))`, `ray::_call`)."""
        for node in list(self.cluster.worker_nodes):
            for proc in self._processes(node):
                try:
                    if marker in " ".join(proc.cmdline()):
                        return node
                except psutil.Error:
                    continue
        return None

    def lose(self, node) -> None:
        """Kill every process of `node` at once (no graceful shutdown: a reclaimed spot
        instance gets none), then add a fresh node in its place."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.ensure_workers()

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LosableCluster]:
    base = os.environ.get("RAY_TMPDIR", "/tmp")
    os.makedirs(os.path.join(base, "ray"), exist_ok=True)  # where Ray notes the cluster's address
    temp = tempfile.mkdtemp(prefix="cprnl-", dir=base)
    c = LosableCluster(temp)
    yield c
    c.shutdown()


def driver(cluster: LosableCluster, *args: str) -> subprocess.Popen:
    """`cpr ARGS` as its own driver process on the cluster (stdout and stderr together)."""
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "cpr_ray.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout_s: float = 240) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return out


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen, timeout_s=180) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {what}:\n{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}:\n{proc.communicate()[0]}")
        time.sleep(0.05)


def lose_node_running(
    cluster: LosableCluster, marker: str, when: Callable[[], bool], proc: subprocess.Popen
) -> None:
    """Once `when()` holds, lose the first worker node found running `marker`."""
    found: list[object] = []

    def ready() -> bool:
        node = cluster.node_running(marker) if when() else None
        found[:] = [node] if node is not None else []
        return bool(found)

    wait_for(f"a node running {marker}", ready, proc)
    cluster.lose(found[0])


def published_table(root: Path, stage: str, table: str):
    import json

    manifest = json.loads((root / stage / "_MANIFEST.json").read_text())
    return pds.dataset(manifest["tables"][table]["uri"], format="parquet").to_table()


# -- an LLM stage ----------------------------------------------------------------------------------

LLM_ROWS = 12


def judge_analogy(cluster: LosableCluster, root: Path, llm: ScriptedLLM) -> subprocess.Popen:
    return driver(
        cluster,
        "build", "--profile", "dry-run", "--stages", "judge-analogy",
        "--llm-base-url", llm.base_url, "--llm-model", "scripted", "--set", "llm.stages={}",
        "--set", f"storage.root={root}", "--set", f"llm.max_rows_per_stage={LLM_ROWS}",
        "--set", "llm.actors=1", "--set", "llm.max_in_flight=2",
    )  # fmt: skip


def test_an_llm_stage_goes_on_when_an_actor_node_is_lost_and_pays_each_row_once(
    cluster: LosableCluster, sample_mined: Path, llm: ScriptedLLM, tmp_path: Path
):
    """judge-analogy, one actor asking two rows at a time in batches of four: once half of the
    second batch is answered (and flushed), the endpoint holds every request, the actor's node
    is removed, and the endpoint goes on. Ray restarts the actor on the other worker and gives
    it the lost batches again: the stage completes in the same run, the two answered rows of
    the lost batch are served from the cache and only the two in flight are asked again, so
    every row is answered once and has one ledger row; the published table is the
    uninterrupted run's."""
    root = copy_build(sample_mined, tmp_path / "lost")
    llm.latency(300)  # the stage lasts long enough to lose a node in it
    proc = judge_analogy(cluster, root, llm)
    wait_for("six answers", lambda: llm.stats().get("answered", 0) >= 6, proc)
    llm.pause()
    time.sleep(1.5)  # every answer received so far reaches the cache (FLUSH_S = 0.5)
    held = llm.stats()
    # batch 2 of 3 (4 rows each) is half answered, its other two rows wait at the endpoint
    assert (held["answered"], held["total"]) == (6, 8), held
    lose_node_running(cluster, "LLMActor", lambda: True, proc)
    llm.resume()
    out = finish(proc)
    stats = llm.stats()
    assert stats["undelivered"] == 2  # the two rows in flight were lost with the actor
    assert stats["answered"] == LLM_ROWS, (stats, out)  # nothing asked twice, nothing missing
    ledger = pds.dataset(str(root / "_llm" / "ledger" / "judge-analogy")).to_table()
    assert ledger.num_rows == LLM_ROWS == len(set(ledger["request_key"].to_pylist()))

    again = copy_build(sample_mined, tmp_path / "uninterrupted")
    llm.reset()
    finish(judge_analogy(cluster, again, llm))
    lost = published_table(root, "judge-analogy", "judged").sort_by("request_key")
    whole = published_table(again, "judge-analogy", "judged").sort_by("request_key")
    assert lost.equals(whole)


# -- ingest and mining -----------------------------------------------------------------------------


def _table(root: Path, stage: str, name: str):
    import json

    import lance

    entry = json.loads((root / stage / "_MANIFEST.json").read_text())["tables"][name]
    if entry["format"] == "lance":
        return lance.dataset(entry["uri"], version=entry["version"]).to_table()
    return pds.dataset(entry["uri"], format="parquet").to_table()


def _has_parquet(folder: Path) -> bool:
    return folder.exists() and any(folder.rglob("*.parquet"))


def test_ingest_and_mining_finish_on_the_surviving_nodes_with_the_same_tables(
    cluster: LosableCluster, sample_mined: Path, tmp_path: Path
):
    """The sample through ingest, venues and mine; the node running a bucket task is removed
    once ingest has written parsed rows, and again once mining has written pairs. Ray retries
    each lost task elsewhere (a retried task rewrites its own files; only the fragments a
    finished task returns are committed), so the run ends as the uninterrupted one did: the
    same papers, citations, venues, base papers, pairs and universe, row for row."""
    root = tmp_path / "build"
    proc = driver(
        cluster, "build", "--profile", "dry-run", "--stages", "ingest,venues,mine",
        "--set", f"storage.root={root}",
    )  # fmt: skip
    for stage in ("ingest", "mine"):
        runs = root / stage / "runs"
        lose_node_running(cluster, "ray::_call", partial(_has_parquet, runs), proc)
    finish(proc)
    for stage, table, keys in (
        ("ingest", "papers", ["corpus_id"]),
        ("ingest", "citations", ["citing_id", "cited_id"]),
        ("ingest", "venues", ["venue_id"]),
        ("mine", "base_papers", ["corpus_id"]),
        ("mine", "pairs", ["base_id", "cited_id"]),
        ("mine", "universe", ["corpus_id"]),
    ):
        order = [(k, "ascending") for k in keys]
        lost = _table(root, stage, table).sort_by(order)
        whole = _table(sample_mined, stage, table).sort_by(order)
        assert lost.num_rows == whole.num_rows > 0, table
        assert lost.equals(whole), table


# -- an encoder actor pool on the GPU node type ----------------------------------------------------


def _busy_for(cluster: LosableCluster, marker: str, cpu_s: float) -> bool:
    """Some worker process titled `marker` has used `cpu_s` of CPU: it is mid-work."""
    for node in list(cluster.cluster.worker_nodes):
        for proc in cluster._processes(node):
            try:
                if marker in " ".join(proc.cmdline()) and sum(proc.cpu_times()[:2]) >= cpu_s:
                    return True
            except psutil.Error:
                continue
    return False


def test_an_index_build_re_encodes_a_lost_encoder_actors_batches_elsewhere(
    cluster: LosableCluster, minilm: str, tmp_path: Path
):
    """`cpr index` with two MiniLM actors that need `cpr_gpu_node` (one per worker): once an
    actor is encoding, its node is removed. Its batches are encoded again by a restarted actor
    on the new node; the index holds every paper once, with the vector MiniLM gives it."""
    from cpr_ray.retrieval.encoder import DenseEncoder
    from cpr_ray.retrieval.spec import EncoderSpec
    from cpr_ray.search.index import _read_vectors, read_manifest
    from cpr_ray.storage import Storage, StorageConfig

    from .search_corpus import papers, write_export

    rows = papers(1200)
    export = write_export(tmp_path / "export", rows)
    out = tmp_path / "index"
    proc = driver(
        cluster, "index", "--corpus", str(export), "--out", str(out), "--model", minilm,
        "--set", "encoder.actors=2", "--set", "encoder.resources_per_actor={cpr_gpu_node: 1}",
    )  # fmt: skip
    encoder = "EncodeDocs"
    lose_node_running(cluster, encoder, partial(_busy_for, cluster, encoder, 4.0), proc)
    finish(proc)

    storage = Storage(StorageConfig())
    manifest = read_manifest(storage, str(out))
    docs = storage.read_parquet(f"{out}/{manifest['docs']}")
    vectors = _read_vectors(storage, str(out), manifest)
    assert sorted(docs["corpus_id"].to_pylist()) == sorted(r["corpus_id"] for r in rows)
    # a batch that never came back would leave zero rows: every paper has a unit vector
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    by_id = {r["corpus_id"]: r for r in rows}
    sample = np.random.default_rng(0).choice(len(rows), 200, replace=False)
    texts = [
        f"{r['title']}. {r['abstract']}" if r["abstract"] else r["title"]
        for r in (by_id[docs["corpus_id"][int(i)].as_py()] for i in sample)
    ]
    expected = DenseEncoder(EncoderSpec(minilm)).encode_docs(texts)
    np.testing.assert_allclose(vectors[sample], expected, atol=1e-4)
