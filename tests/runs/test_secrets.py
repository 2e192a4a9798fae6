"""No secret is written anywhere: the LLM key, the S2 key, the search service's key and a
pre-signed URL's signature never reach a log, manifest, ledger, cache, stats file, card, console
line or error message of a build, a refresh, a training run, an evaluation or the search
service, on success or on refusal.

Every secret is a sentinel no other test uses, and every process gets all of them, so a leak of
any one anywhere is found. After each run every file under the build root (or the index and
the service's log) and the Ray session's folder is searched for the sentinels' bytes, Parquet
and Lance tables and gzip files also decoded (their pages may be compressed), as well as what
the run printed and the error it ended with. The LLM endpoint checks the key (so a run that
passes did carry it) and, refusing one, quotes it back in its 401 body as careless servers do.

Build, training, evaluation and service run in their own process and local Ray, the keys in
the environment they start with, so Ray's workers have them as on a cluster
(`infra/launcher/node-env.sh`); the refresh and the refusals, whose keys only the driver reads,
run here on the session's Ray. The service is tests/search/test_search_service.py's, started once
with these keys for both.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cpr_ray.config import sample_dir
from cpr_ray.cpr_command import app
from cpr_ray.sample.diffs import make_diff
from tests.builds import NEW, OLD, copy_build
from tests.llm.test_llm_reliability import cpr_build, published
from tests.standins.clients import S2_FILES_HOST, S2StandIn
from tests.standins.launch import CPR, standin, start_local_server

OPENAI_KEY = "sk-SENTINEL-openai-4c1d9e7a2b"
WRONG_OPENAI_KEY = "sk-SENTINEL-revoked-8e2f61d0"
S2_KEY = "s2-SENTINEL-key-b7093c5e"
WRONG_S2_KEY = "s2-SENTINEL-revoked-61fa2d94"
SERVICE_KEY = "svc-SENTINEL-key-2d8c4f11"
WRONG_SERVICE_KEY = "svc-SENTINEL-wrong-93b0e6a7"
SIGNATURE = "SENTINELsig5e1f0c9a77d2"  # the stand-in appends a request count
SECRETS = (
    OPENAI_KEY,
    WRONG_OPENAI_KEY,
    S2_KEY,
    WRONG_S2_KEY,
    SERVICE_KEY,
    WRONG_SERVICE_KEY,
    SIGNATURE,
)
# every key in the environment of every process under test (the service's variable as infra's)
KEYS_ENV = {"OPENAI_API_KEY": OPENAI_KEY, "S2_API_KEY": S2_KEY, "CPR_SEARCH_API_KEY": SERVICE_KEY}
ROOT = Path(__file__).resolve().parents[2]


# -- looking for the sentinels ----------------------------------------------------------------


def _decoded(path: Path, data: bytes) -> Iterator[bytes]:
    """The file's bytes, and what a compressed or columnar file holds once decoded."""
    yield data
    if data[:2] == b"\x1f\x8b":
        try:
            yield gzip.decompress(data)
        except (OSError, EOFError):
            pass
    if data[:4] == b"PAR1":
        try:
            table = pq.read_table(path)
            yield repr(table.schema.metadata).encode() + repr(table.to_pylist()).encode()
        except Exception:  # a part being written, a foreign file: its raw bytes were searched
            pass


def _lance_tables(folder: Path) -> Iterator[tuple[Path, bytes]]:
    """Every version of every Lance dataset under `folder`, decoded."""
    for versions in folder.rglob("_versions"):
        uri = versions.parent
        try:
            versions = [v["version"] for v in lance.dataset(str(uri)).versions()]
            for v in versions:
                rows = lance.dataset(str(uri), version=v).to_table().to_pylist()
                yield uri, repr(rows).encode()
        except Exception:  # not a dataset after all; its files' bytes were searched
            continue


def leaks(places: Iterable[Path | str], *texts: str) -> list[str]:
    """Where any sentinel appears: 'path: sentinel' for files (bytes, decoded too), 'text N:
    sentinel' for printed output and messages."""
    needles = [s.encode() for s in SECRETS]
    found = []
    for i, text in enumerate(texts):
        found += [f"text {i}: {s}" for s in SECRETS if s in text]
    for place in map(Path, places):
        files = place.rglob("*") if place.is_dir() else [place]
        for path in files:
            if path.is_symlink() or not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except OSError:  # gone meanwhile (a Ray socket, a temporary part)
                continue
            for blob in _decoded(path, data):
                found += [f"{path}: {n.decode()}" for n in needles if n in blob]
        if place.is_dir():
            for uri, blob in _lance_tables(place):
                found += [f"{uri} (decoded): {n.decode()}" for n in needles if n in blob]
    return sorted(set(found))


def assert_no_secret(places: Iterable[Path | str], *texts: str) -> None:
    found = leaks(places, *texts)
    assert not found, "secrets written:\n" + "\n".join(found)


def searched(places: Iterable[Path | str]) -> int:
    """How many files `leaks` read: a search of nothing proves nothing."""
    return sum(
        1
        for place in map(Path, places)
        for p in (place.rglob("*") if place.is_dir() else [place])
        if p.is_file()
    )


def session_dir() -> Path:
    """This process's Ray session folder (its logs/ is where Ray tracebacks of errors go)."""
    import ray

    ctx = ray.get_runtime_context()
    return Path(ctx.get_temp_dir()) / ctx.get_session_name()


def ray_temp_dir() -> str:
    """A fresh temp folder for a child's own local Ray (short: socket paths must fit)."""
    return tempfile.mkdtemp(prefix="cprsec-", dir=os.environ.get("RAY_TMPDIR", "/tmp"))


def test_the_search_finds_a_secret_in_every_kind_of_file(tmp_path):
    """A search that could not see into compressed files would pass vacuously."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker.log").write_text(f"Authorization: Bearer {OPENAI_KEY}\n")
    (tmp_path / "update-00000.jsonl.gz").write_bytes(gzip.compress(S2_KEY.encode()))
    rows = {"error": [f"GET /f?X-Amz-Signature={SIGNATURE}{i}" for i in range(500)]}
    pq.write_table(pa.table(rows), tmp_path / "ledger.parquet", compression="zstd")
    lance.write_dataset(pa.table({"key": [SERVICE_KEY] * 500}), str(tmp_path / "t.lance"))
    found = leaks([tmp_path], f"401: {WRONG_S2_KEY}")
    assert "text 0: " + WRONG_S2_KEY in found
    for where, secret in [
        ("worker.log", OPENAI_KEY),
        ("update-00000.jsonl.gz", S2_KEY),
        ("ledger.parquet", SIGNATURE),
        ("t.lance (decoded)", SERVICE_KEY),
    ]:
        assert any(f.endswith(f"{where}: {secret}") for f in found), (where, found)


# -- an LLM endpoint that checks the key ------------------------------------------------------


class KeyCheckingEndpoint:
    """In front of the scripted model: a request bearing `key` is passed on; any other is
    refused with 401, its body quoting the key it was given. `seen` holds each request's
    Authorization header."""

    def __init__(self, upstream: str, key: str) -> None:
        self.seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                given = self.headers.get("Authorization", "")
                outer.seen.append(given)
                if given != f"Bearer {key}":
                    message = f"Incorrect API key provided: {given.removeprefix('Bearer ')}"
                    self._send(401, json.dumps({"error": {"message": message}}).encode())
                    return
                req = urllib.request.Request(
                    upstream + self.path,
                    data=body if self.command == "POST" else None,
                    headers={"Content-Type": "application/json"},
                    method=self.command,
                )
                try:
                    with urllib.request.urlopen(req, timeout=120) as resp:
                        self._send(resp.status, resp.read(), resp.headers.get("Content-Type"))
                except urllib.error.HTTPError as exc:
                    self._send(exc.code, exc.read(), exc.headers.get("Content-Type"))

            def _send(self, status: int, body: bytes, ctype: str | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _relay

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def endpoint(scripted_llm) -> Iterator[KeyCheckingEndpoint]:
    scripted_llm.reset()
    proxy = KeyCheckingEndpoint(scripted_llm.url, OPENAI_KEY)
    yield proxy
    proxy.close()


# -- a build ------------------------------------------------------------------------------------


def test_a_build_carries_the_llm_key_and_writes_it_nowhere(sample_mined, endpoint, llm, tmp_path):
    """`cpr build` in its own process and its own local Ray, as a user runs it: the key is in the
    environment of the driver and of every LLM actor. One row's calls fail (two 500s), so an
    error is in the ledger too."""
    root = copy_build(sample_mined, tmp_path / "build")
    ray_tmp = ray_temp_dir()
    llm.faults({"kind": "500"}, {"kind": "500"})
    endpoint.seen.clear()
    cmd = [
        *CPR, "build", "--profile", "dry-run",
        "--stages", "judge-analogy", "--llm-base-url", endpoint.base_url, "--llm-model", "scripted",
        "--set", "llm.stages={}", "--set", f"storage.root={root}",
        "--set", "llm.max_rows_per_stage=8", "--set", "llm.actors=1",
        "--set", "llm.max_in_flight=1", "--set", "llm.max_retries=1",
        "--set", "llm.backoff_base_s=0.05", "--set", "llm.max_failure_rate=0.5",
        "--set", "ray.num_cpus=2", "--set", f"ray.temp_dir={ray_tmp}",
    ]  # fmt: skip
    try:
        run = subprocess.run(
            cmd,
            env={**os.environ, **KEYS_ENV, "RAY_ADDRESS": "", "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        stats = published(root)["stats"]
        assert stats["new_failed"] == 1 and stats["new_ok"] + stats["new_invalid"] == 7, stats
        # the endpoint checked the key: the probe and every chat call carried it
        assert len(endpoint.seen) >= 10 and set(endpoint.seen) == {f"Bearer {OPENAI_KEY}"}
        assert searched([root / "_llm" / "ledger", ray_tmp]) > 20
        # the env_vars our code ships to Ray's workers are in Ray's logs (runtime_env_agent.log):
        # a key shipped that way would be found below
        logs = [f for f in Path(ray_tmp).rglob("*.log") if f.is_file()]
        assert any(b'"LANCE_LOG": "error"' in f.read_bytes() for f in logs)
        shown = CliRunner().invoke(app, ["stats", str(root)], env={"COLUMNS": "400"})
        assert shown.exit_code == 0 and "judge-analogy" in shown.output, shown.output
        assert_no_secret([root, ray_tmp], run.stdout, run.stderr, shown.output)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_refused_llm_key_is_named_by_its_variable_never_by_its_value(
    sample_mined, endpoint, llm, tmp_path, monkeypatch, capfd
):
    root = copy_build(sample_mined, tmp_path / "build")
    monkeypatch.setenv("OPENAI_API_KEY", WRONG_OPENAI_KEY)
    code, out = cpr_build(root, endpoint.base_url)
    assert code == 2, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert "refused the API key (HTTP 401); set $OPENAI_API_KEY" in line
    assert endpoint.seen[-1] == f"Bearer {WRONG_OPENAI_KEY}"  # sent, refused, quoted back
    captured = capfd.readouterr()
    assert_no_secret([root, session_dir()], out, captured.out, captured.err)


# -- a training run and its evaluation ------------------------------------------------------------


def _cpr(args: list[str], ray_tmp: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`cpr ARGS` in its own process and its own local Ray, the keys in its environment (so Ray
    Train's workers and the evaluation's actors have them, as a cluster node's processes do)."""
    sets = ["--set", "ray.num_cpus=2", "--set", f"ray.temp_dir={ray_tmp}"]
    return subprocess.run(
        [*CPR, *args, *sets],
        env={**os.environ, **env, "RAY_ADDRESS": "", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_training_run_and_its_evaluation_write_no_key(
    endpoint, tiny_bert, tmp_path, monkeypatch, capfd
):
    """`cpr train` in its own process and Ray, every key in their environment (Ray Train's
    workers have them, as a cluster node's do), then `cpr eval` of its model with the LLM
    reranker, whose driver reads the key: the run folder, the model and its card, the results,
    the reranker's cache and ledger and the Ray sessions hold none, nor what was printed; nor
    after an evaluation whose key the endpoint refuses and quotes back."""
    from tests.cards.test_model_card import training_export

    export = training_export(tmp_path)
    out, results = tmp_path / "run", tmp_path / "results"
    ray_tmp = ray_temp_dir()
    try:
        train = ["train", "--data", str(export), "--format", "cpr", "--model", tiny_bert]
        train += ["--out", str(out), "--set", "train.max_steps=1", "--set", "train.batch_size=4"]
        train += ["--set", "train.max_length=32"]
        train += ["--set", "ray.num_cpus=2", "--set", f"ray.temp_dir={ray_tmp}"]
        train += ["--set", "tracking.enabled=true"]  # MLflow's store and artifacts under out
        run = subprocess.run(
            [*CPR, *train],
            env={**os.environ, **KEYS_ENV, "RAY_ADDRESS": "", "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        printed = [run.stdout, run.stderr]
        for name, value in KEYS_ENV.items():
            monkeypatch.setenv(name, value)
        evaluate = ["eval", "--benchmark", "cpr", "--data", str(export), "--retriever", "dense"]
        evaluate += ["--model", str(out / "model"), "--rerank", "llm", "--out", str(results)]
        evaluate += ["--set", f"llm.base_url={endpoint.base_url}", "--set", "llm.model=scripted"]
        evaluate += ["--set", "eval.resamples=50", "--set", "eval.rerank_depth=4"]
        evaluate += ["--set", "tracking.enabled=true"]  # into the training's MLflow run
        endpoint.seen.clear()
        cli = CliRunner()
        done = cli.invoke(app, [*evaluate, "--set", f"eval.llm_root={tmp_path / 'llm'}"])
        printed.append(done.output)
        assert done.exit_code == 0 and "model card → " in done.output, done.output
        assert endpoint.seen and set(endpoint.seen) == {f"Bearer {OPENAI_KEY}"}
        monkeypatch.setenv("OPENAI_API_KEY", WRONG_OPENAI_KEY)
        refused = cli.invoke(app, [*evaluate, "--set", f"eval.llm_root={tmp_path / 'llm2'}"])
        printed.append(refused.output)
        assert refused.exit_code == 2, refused.output
        assert "refused the API key (HTTP 401); set $OPENAI_API_KEY" in refused.output
        assert endpoint.seen[-1] == f"Bearer {WRONG_OPENAI_KEY}"  # sent, refused, quoted back
        assert searched([out, results, tmp_path / "llm"]) > 10
        assert (out / "mlruns.db").is_file() and any((out / "mlartifacts").rglob("eval/cpr/*.json"))
        captured = capfd.readouterr()
        places = [tmp_path, ray_tmp, session_dir()]
        assert_no_secret(places, *printed, captured.out, captured.err)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


# -- a refresh ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s2(sample_mined, tmp_path_factory) -> Iterator[S2StandIn]:
    """The Datasets API stand-in demanding `S2_KEY`, signing its file URLs with `SIGNATURE`,
    serving one release step made from the mined sample."""
    tmp = tmp_path_factory.mktemp("s2")
    root = tmp / "api"
    root.mkdir()
    (root / "releases.json").write_text(json.dumps([OLD, NEW]))
    mine = json.loads((sample_mined / "mine" / "_MANIFEST.json").read_text())
    make_diff(
        sample_dir() / "s2",
        shutil.copytree(sample_dir() / "openalex", tmp / "openalex"),  # not read by the refresh
        root,
        pq.read_table(mine["tables"]["pairs"]["uri"]),
        releases=(OLD, NEW),
    )
    args = [*standin("s2_api"), "--root", str(root), "--port", "{port}"]
    proc, url = start_local_server(
        [*args, "--api-key", S2_KEY, "--signature", SIGNATURE, "--files-host", S2_FILES_HOST],
        "/_stats",
        tmp / "standin.log",
        cwd=ROOT,
    )
    yield S2StandIn(url, root)
    proc.terminate()
    proc.wait(timeout=10)


def cpr_refresh(root: Path, s2: S2StandIn) -> tuple[int, str]:
    """`cpr refresh --corpus-only` in this process (the key is read by the driver only)."""
    sets = [
        f"storage.root={root}",
        f"refresh.base_release={OLD}",
        f"refresh.api_url={s2.api_url}",
        "refresh.requests_per_second=50",
        "refresh.max_retries=0",
        "refresh.retain_versions_days=0",
    ]
    args = ["refresh", "--profile", "dry-run", "--corpus-only"]
    result = CliRunner().invoke(
        app, [*args, *[a for s in sets for a in ("--set", s)]], env={"COLUMNS": "400"}
    )
    return result.exit_code, result.output


def error_line(out: str) -> str:
    [line] = [ln for ln in out.splitlines() if ln.startswith("error:")]
    return line


def test_a_refresh_shows_neither_the_s2_key_nor_a_url_signature(
    sample_mined, s2, tmp_path, monkeypatch, capfd
):
    root = copy_build(sample_mined, tmp_path / "build")
    for name, value in KEYS_ENV.items():
        monkeypatch.setenv(name, value)
    outputs = []

    monkeypatch.setenv("S2_API_KEY", WRONG_S2_KEY)  # a revoked key
    code, out = cpr_refresh(root, s2)
    outputs.append(out)
    assert code == 2 and "Semantic Scholar refused" in error_line(out), out
    assert "(HTTP 403): set a valid API key" in error_line(out)

    monkeypatch.setenv("S2_API_KEY", S2_KEY)
    s2.reset()
    s2.faults({"kind": "403", "on": "files"})  # a pre-signed URL that expired
    code, out = cpr_refresh(root, s2)
    outputs.append(out)
    line = error_line(out)
    files_url = s2.url.replace("127.0.0.1", S2_FILES_HOST)
    # the step's files are fetched at once, one task each: whichever was refused first is named
    refused = re.search(rf"refused {re.escape(files_url)}/files/{OLD}/{NEW}/\w+/update-", line)
    assert code == 2 and refused, out
    assert "?" not in line.split("refused ", 1)[1].split(" ")[0]  # the URL, no query string

    code, out = cpr_refresh(root, s2)  # the endpoint is fine again
    outputs.append(out)
    assert code == 0 and f"corpus: S2 {OLD} → {NEW}, 1 release step(s) applied" in out, out
    stats = s2.stats()
    assert stats["file"] >= 4 and stats["bad_key"] == 0, stats  # signed URLs fetched, key sent
    # ... to the API only: the files' host (another one, as S3 is S2's) never saw it
    assert stats["elsewhere"] >= stats["file"] and stats.get("key_elsewhere", 0) == 0, stats

    captured = capfd.readouterr()
    assert searched([root / "_refresh", root / "ingest"]) > 5
    assert_no_secret([root, session_dir()], *outputs, captured.out, captured.err)


# -- the search service -------------------------------------------------------------------------
# `cpr serve` in its own process and Ray with these keys in its environment, its replicas reading
# the service key from theirs: tests/search/test_search_service.py's service, whose test sends the
# right key, the wrong one and none, stops it with SIGTERM and then searches its log, its index and
# its Ray folder for every sentinel here (one service started for both).
