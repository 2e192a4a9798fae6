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

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import pyarrow.dataset as pds
import pytest

from tests.builds import copy_build
from tests.standins.clients import ScriptedLLM
from tests.standins.launch import CPR, free_port

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
                # a killed node fails its health checks at once (nothing listens): checked
                # every second, it is declared dead after ~5 s, not Ray's default ~15 s, which
                # each loss would otherwise wait through; a live node slowed by a loaded machine
                # keeps Ray's 10 s to answer each check
                "_system_config": {
                    "health_check_period_ms": 1000,
                    "health_check_failure_threshold": 5,
                },
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
    temp = tempfile.mkdtemp(prefix="cprnl-", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
    # Ray notes a new cluster's address in RAY_TMPDIR/ray/ray_current_cluster, and a plain
    # `ray.init()` on this machine (another test's local Ray, the dry run's) joins the cluster
    # named there: this one's note goes to its own folder, where nothing else looks
    os.makedirs(os.path.join(temp, "ray"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", temp)
        c = LosableCluster(temp)
    yield c
    c.shutdown()


def driver(cluster: LosableCluster, *args: str) -> subprocess.Popen:
    """`cpr ARGS` as its own driver process on the cluster (stdout and stderr together)."""
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "COLUMNS": "200"}
    return subprocess.Popen(
        [*CPR, *args],
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
        "--set", "llm.inline_max_rows=0",  # an actor pool, whatever the rows: its node is lost
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
    from cpr_ray.search.engine import SearchIndex
    from cpr_ray.search.sharded_index import read_manifest
    from cpr_ray.storage.store import Storage, StorageConfig
    from tests.search_corpus import papers, write_export

    rows = papers(600)
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
    vectors = np.concatenate([s.vectors for s in SearchIndex.load(storage, str(out)).shards])
    assert sorted(docs["corpus_id"].to_pylist()) == sorted(r["corpus_id"] for r in rows)
    # a batch that never came back would leave zero rows: every paper has a unit vector
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    by_id = {r["corpus_id"]: r for r in rows}
    sample = np.random.default_rng(0).choice(len(rows), 200, replace=False)
    texts = [
        f"{r['title']}. {r['abstract']}" if r["abstract"] else r["title"]
        for r in (by_id[docs["corpus_id"][int(i)].as_py()] for i in sample)
    ]
    expected = DenseEncoder(EncoderSpec(model=minilm)).encode_docs(texts)
    np.testing.assert_allclose(vectors[sample], expected, atol=1e-4)


# -- training --------------------------------------------------------------------------------------

TRAIN_STEPS = 8


TRAIN_SETTINGS = (
    "train.workers=2", "train.batch_size=4", "train.max_length=32",
    f"train.epochs={TRAIN_STEPS // 2}", "train.lr=1e-4", "train.checkpoint_every=2",
    "train.max_failures=1", "train.resources_per_worker={cpr_gpu_node: 1}",
)  # fmt: skip


def cpr_train(cluster: LosableCluster, data: str, model: str, out: Path) -> subprocess.Popen:
    settings = [arg for setting in TRAIN_SETTINGS for arg in ("--set", setting)]
    return driver(
        cluster, "train", "--format", "triplets", "--data", data, "--model", model,
        "--out", str(out), *settings,
    )  # fmt: skip


def _steps_done(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_training_restores_from_its_checkpoint_when_a_worker_node_is_lost(
    cluster: LosableCluster, minilm: str, tmp_path: Path
):
    """Two Ray Train workers, one per worker node (each needs `cpr_gpu_node`), checkpointing
    every two steps: once a checkpoint is whole on storage, one worker's node is removed. Ray
    Train (one failure allowed) starts the group again on the new node from the newest
    checkpoint, and the run ends with the weights of an uninterrupted run of the same seed
    (the run's steps in this process: without dropout two workers train as one process)."""
    from cpr_ray.config import load_config
    from cpr_ray.retrieval.encoder import Encoder
    from cpr_ray.storage.store import Storage, StorageConfig
    from tests import tiny_models
    from tests.train.test_train_ray import _triplets, _uninterrupted

    model = tiny_models.tiny_bert(minilm, tmp_path / "tiny-bert", dropout=0.0)
    data = _triplets(tmp_path / "train.jsonl")
    out = tmp_path / "lost"
    proc = cpr_train(cluster, data, model, out)
    # metrics.jsonl is written as a checkpoint is saved, before it is on storage: four lines
    # say step 4's checkpoint is being saved, so step 2's is whole
    lose_node_running(cluster, "RayTrainWorker", lambda: _steps_done(out) >= 4, proc)
    printed = finish(proc, timeout_s=300)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, TRAIN_STEPS + 1)), printed
    assert max(r["resumed_from"] for r in rows) >= 2, printed  # it restored from a checkpoint

    flags = {"train.data": data, "train.format": "triplets", "train.out": str(out)}
    cfg = load_config(overrides=[*TRAIN_SETTINGS, f"encoder.model={model}"], flags=flags)
    expected = _uninterrupted(cfg, Storage(StorageConfig())).state_dict()
    trained = Encoder.load(str(out / "model")).state_dict()
    assert trained.keys() == expected.keys()
    # a resume that lost the optimiser or the schedule is off by ~lr (1e-4); float noise in
    # the order of the workers' sums moves AdamW's small-gradient weights by far less
    for name, tensor in expected.items():
        np.testing.assert_allclose(trained[name].numpy(), tensor.numpy(), atol=1e-5, err_msg=name)


# -- the search service ----------------------------------------------------------------------------


def _ask(url: str, timeout_s: float) -> tuple[int, float]:
    """POST one search; (HTTP status, seconds), status 0 when no answer came in time."""
    import urllib.error
    import urllib.request

    body = json.dumps({"query": "How to train a neural network classifier?", "k": 3}).encode()
    req = urllib.request.Request(
        f"{url}/search", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
            return resp.status, time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic() - started
    except OSError:
        return 0, time.monotonic() - started


def test_the_search_service_answers_200_or_503_while_a_replica_node_is_lost(
    cluster: LosableCluster, minilm: str, tmp_path: Path
):
    """`cpr serve` with two replicas, one per worker: four clients send searches without pause;
    once each has had answers, one replica's node is removed. Every request gets 200 or 503
    within the request timeout (never a 500 or a hang), and the service answers 200 again
    within a bounded time, on the surviving replica and then on its replacement."""
    import threading

    from tests.search_corpus import papers, write_export

    export = write_export(tmp_path / "export", papers(200))
    index = tmp_path / "index"
    finish(
        driver(cluster, "index", "--corpus", str(export), "--out", str(index), "--model", minilm)
    )
    port = free_port()
    proc = driver(
        cluster, "serve", str(index), "--set", f"search.serve.port={port}",
        "--set", "search.serve.min_replicas=2", "--set", "search.serve.max_replicas=2",
        "--set", "search.serve.cpus_per_replica=1",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    timeout_s = 30.0
    try:
        wait_for("the service", lambda: _ask(url, 5)[0] == 200, proc, timeout_s=240)
        answers: list[tuple[float, int, float]] = []  # (sent at, status, seconds)
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                sent = time.monotonic()
                status, took = _ask(url, timeout_s)
                answers.append((sent, status, took))

        clients = [threading.Thread(target=client) for _ in range(4)]
        for c in clients:
            c.start()
        wait_for("answers to every client", lambda: len(answers) >= 20, proc)
        lost_at = time.monotonic()
        lose_node_running(cluster, "ServeReplica", lambda: True, proc)
        # the service is back once ten answers in a row after the loss are 200
        wait_for(
            "the service to answer again",
            lambda: [s for t, s, _ in answers if t > lost_at + 1][-10:] == [200] * 10,
            proc,
            timeout_s=120,
        )
        stop.set()
        for c in clients:
            c.join(timeout=timeout_s + 5)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    statuses = {s for _, s, _ in answers}
    assert statuses <= {200, 503}, sorted((t - lost_at, s) for t, s, _ in answers if s != 200)
    assert max(took for _, _, took in answers) < timeout_s
