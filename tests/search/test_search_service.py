"""The search service end to end on loopback: `cpr serve` in its own process (its own local Ray),
answered over HTTP; and the cluster's Serve config file checked by Serve's own schema."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.search_corpus import build_search_index, papers
from tests.standins.launch import CPR, free_port

ROOT = Path(__file__).resolve().parents[2]
KEY = "svc-SENTINEL-key-2d8c4f11"  # tests/runs/test_secrets.py's SERVICE_KEY: no file may hold it


def post(
    url: str,
    body: bytes | dict,
    key: str | None = KEY,
    timeout: float = 60,
    with_headers: bool = False,
) -> tuple:
    """(status, JSON body) of a POST /search, or (status, headers, JSON body) `with_headers`."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **({"x-api-key": key} if key else {})}
    req = urllib.request.Request(url + "/search", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, seen, text = resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, seen, text = exc.code, exc.headers, exc.read().decode()
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        answer = {"raw": text}
    return (status, seen, answer) if with_headers else (status, answer)


@pytest.fixture(scope="module")
def service(minilm, ray_session, tmp_path_factory):
    """`cpr serve` with every sentinel key of tests/runs/test_secrets.py in its environment (the
    service's own under infra's variable) and its own Ray folder, which the test searches for
    them once the service has stopped."""
    from tests.runs.test_secrets import KEYS_ENV, ray_temp_dir

    assert KEYS_ENV["CPR_SEARCH_API_KEY"] == KEY
    tmp = tmp_path_factory.mktemp("service")
    ray_tmp = ray_temp_dir()
    build_search_index(tmp, papers(120), minilm)
    port = free_port()
    log = open(tmp / "serve.log", "w")
    proc = subprocess.Popen(
        [
            *CPR,
            "serve",
            str(tmp / "idx"),
            "--port",
            str(port),
            "--set",
            "search.serve.max_ongoing_requests=1",
            "--set",
            "search.serve.max_queued_requests=1",
            "--set",
            "search.serve.max_queries=32",
            "--set",
            "search.serve.max_body_bytes=4096",
            "--set",
            "search.serve.api_key_env=CPR_SEARCH_API_KEY",
            "--set",
            "ray.num_cpus=2",
            "--set",
            f"ray.temp_dir={ray_tmp}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **KEYS_ENV, "RAY_ADDRESS": ""},
        cwd=ROOT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                health = json.loads(resp.read())
                break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(
                    "cpr serve did not come up:\n" + (tmp / "serve.log").read_text()[-4000:]
                )
            time.sleep(1)
    yield url, health, proc, tmp / "serve.log", tmp / "idx", ray_tmp
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed test left of it
    except ProcessLookupError:
        pass
    log.close()
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_service_answers_validates_and_sheds_load(service):
    """The service answers, refuses what `cpr search` refuses in the same words, checks its key
    (its replicas read it from their environment), sheds load and stops on SIGTERM; then nothing
    it wrote or answered holds a secret (tests/runs/test_secrets.py's sentinels: the service's key,
    the wrong one sent here, and the other keys in its environment)."""
    from tests.runs.test_secrets import WRONG_SERVICE_KEY, assert_no_secret, searched

    url, health, proc, log, idx, ray_tmp = service
    assert health == {**health, "status": "ok", "documents": 120, "api_key": True}
    with urllib.request.urlopen(url + "/openapi.json", timeout=10) as resp:
        schema = json.loads(resp.read())
    assert {"/search", "/healthz"} <= set(schema["paths"])
    assert "SearchRequest" in json.dumps(schema["components"])

    status, body = post(url, {"query": "How to fold a protein?", "k": 5, "other_fields_only": True})
    assert status == 200
    [result] = body["results"]
    assert result["query_field_source"] == "inferred" and len(result["hits"]) == 5
    assert all(h["field"] != result["query_field"] for h in result["hits"])
    assert {"corpus_id", "score", "title", "field", "year"} <= set(result["hits"][0])
    # hybrid by default (the index has both sides), one side on request; a query's own paper
    # (excluded_ids) never returns
    assert result["retriever"] == "hybrid" and result["fusion"]["method"] == "rrf"
    own = result["hits"][0]["corpus_id"]
    asked = {"queries": [{"query": "How to fold a protein?", "excluded_ids": [own]}], "k": 5}
    status, body = post(url, {**asked, "other_fields_only": True, "retriever": "dense"})
    assert status == 200 and body["results"][0]["retriever"] == "dense"
    assert own not in [h["corpus_id"] for h in body["results"][0]["hits"]]
    status, body = post(url, {**asked, "other_fields_only": True})
    assert own not in [h["corpus_id"] for h in body["results"][0]["hits"]]
    assert len(body["results"][0]["hits"]) == 5

    # the caller's mistakes: a message naming what is wrong, no stack trace
    status, body = post(url, {"query": "x", "colour": "red"})
    assert status == 422 and "colour" in body["error"]
    # what `cpr search` refuses, refused by the same checks in the same words
    for bad, words in (
        ({"query": "x", "k": 0}, "k 0: hits per query go from 1 to search.max_k (1000)"),
        ({"query": "x", "k": 5000}, "k 5000: hits per query go from 1 to search.max_k"),
        ({"query": "   "}, "query q1 is empty"),
        ({"queries": [{"query": "How to a?"}, {"query": ""}]}, "query q2 is empty"),
    ):
        status, body = post(url, bad)
        assert status == 422 and words in body["error"], (bad, body)
    status, body = post(url, {"queries": [{"query": "a"}] * 33})
    assert status == 422 and "max_queries" in json.dumps(body)
    status, body = post(url, b"{not json")
    assert status == 422 and "Traceback" not in json.dumps(body)
    status, body = post(url, {"query": "x" * 3900, "k": 3} | {"pad": "y" * 400})
    assert status == 413 and "max_body_bytes" in body["error"]
    # the key: right, wrong and none
    query = {"query": "How to fold a protein?", "k": 2}
    answers = [post(url, query, key=k) for k in (KEY, WRONG_SERVICE_KEY, None)]
    assert [s for s, _ in answers] == [200, 401, 401], answers

    # below the limit (one request at a time): every request answered
    batch = {
        "queries": [
            {"query_id": f"q{i}", "query": f"How to study market price {i}?"} for i in range(16)
        ],
        "k": 50,
    }
    assert [post(url, batch)[0] for _ in range(3)] == [200, 200, 200]
    # over it (1 running + 1 queued): the rest are refused at once with 503 and a Retry-After
    # (a client's back-off), none fails
    with ThreadPoolExecutor(12) as pool:
        shed = list(pool.map(lambda _: post(url, batch, with_headers=True), range(12)))
    statuses = [status for status, _, _ in shed]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(503) >= 1 and statuses.count(200) >= 2, statuses
    refusals = [
        (headers.get("retry-after"), body) for status, headers, body in shed if status == 503
    ]
    assert all(
        r == ("1", {"error": "every search replica is busy: retry shortly"}) for r in refusals
    ), refusals

    # SIGTERM (to the command, as a process manager sends it) stops the service and its Ray
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert "search service stopped" in log.read_text()
    assert searched([ray_tmp]) > 20
    assert_no_secret([log, idx, ray_tmp], json.dumps(answers))


def test_cluster_serve_config_builds_with_serves_schema(monkeypatch):
    from ray.serve.schema import ServeDeploySchema

    from cpr_ray.search.serve import app_builder

    text = (ROOT / "infra" / "serve" / "search.yaml").read_text()
    deploy = ServeDeploySchema.model_validate(yaml.safe_load(text))
    [application] = deploy.applications
    assert application.import_path == "cpr_ray.search.serve:app_builder"
    assert application.route_prefix == "/"
    args = dict(application.args)
    assert args["index"].startswith("s3://")
    # the builder turns those args into an application (the index is only read by replicas)
    assert "search.serve.api_key_env=CPR_SEARCH_API_KEY" in args["set"]
    monkeypatch.setenv("CPR_SEARCH_API_KEY", "k")
    app = app_builder(args)
    assert type(app).__name__ == "Application"
