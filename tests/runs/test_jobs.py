"""The jobs as users run them: `ray job submit` to a real Ray head on loopback (its dashboard
serves the Jobs API), the build writing to the S3 endpoint on loopback."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import lance
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

from cpr_ray.config import load_config, sample_dir
from cpr_ray.llm.spend import in_doubt
from cpr_ray.sample.diffs import make_diff
from cpr_ray.storage.store import Storage
from tests.builds import NEW, OLD, copy_build, flushed_answers, ray_head_process, small_build
from tests.standins.clients import S2StandIn
from tests.standins.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
pytestmark = pytest.mark.slow
# The head takes jobs only with its token, as the cluster's do (cluster.yaml, infra/k8s/): every
# client here presents it, as `ray job submit` does with this environment
TOKEN = secrets.token_hex(16)
WITH_TOKEN = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A head with its dashboard (the Jobs API), in its own process group: `ray stop` would stop
    every Ray on this machine, the tests' own included."""
    dashboard = free_port()
    # an entrypoint's `python` is the first on the head's PATH: this environment's, as on a node
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {
        **os.environ,
        **WITH_TOKEN,
        "PATH": path,
        # beside another test process on 2 cores the dashboard can take longer than Ray's 60 s
        "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "300",
    }
    options = [f"--port={free_port()}", "--dashboard-host=127.0.0.1"]
    options += [f"--dashboard-port={dashboard}", "--num-cpus=2", "--object-store-memory=300000000"]
    with ray_head_process("cprhead-", options, env) as (proc, temp):
        url = f"http://127.0.0.1:{dashboard}"
        deadline = time.time() + 360
        while True:
            try:
                version = urllib.request.Request(f"{url}/api/version", headers=AUTH)
                urllib.request.urlopen(version, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log_text = (temp / "head.log").read_text()
                    raise RuntimeError(f"ray head did not start: {log_text}") from None
                time.sleep(1)
        yield url


def submit(head: str, job_id: str, env_vars: dict[str, str], *entrypoint: str) -> None:
    """`ray job submit --no-wait`, retried while the head's dashboard agent is still starting
    (the Jobs API answers before the agent that runs jobs has registered; on 2 loaded cores
    that can take a minute)."""
    deadline = time.time() + 180
    while True:
        out = subprocess.run(
            [
                RAY,
                "job",
                "submit",
                "--address",
                head,
                "--submission-id",
                job_id,
                "--no-wait",
                "--working-dir",
                str(ROOT),
                "--runtime-env-json",
                json.dumps({"env_vars": env_vars}),
                "--",
                *entrypoint,
            ],
            env={**os.environ, **WITH_TOKEN},
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = out.stdout + out.stderr
        starting = "No available agent" in text or "status code 503" in text
        if out.returncode == 0 or not starting or time.time() > deadline:
            break
        time.sleep(2)
    assert out.returncode == 0, out.stdout + out.stderr


def jobs_client(head: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(head, headers=AUTH)


def wait(head: str, job_id: str, timeout_s: float = 600) -> tuple[str, str]:
    from ray.job_submission import JobStatus

    client = jobs_client(head)
    deadline = time.time() + timeout_s
    while (status := client.get_job_status(job_id)) not in (
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
    ):
        assert time.time() < deadline, f"{job_id} still {status}"
        time.sleep(0.5)  # a status is one small request; a job ended is seen within half a second
    return str(status.value), client.get_job_logs(job_id)


def test_build_and_refresh_jobs_on_a_real_head_write_to_s3_and_a_bad_config_fails_in_one_line(
    ray_head, s3_endpoint, s3_bucket, scripted_llm, s2_api, tmp_path
):
    root = f"s3://{s3_bucket}/build"
    scripted_llm.reset()
    scripted_llm.negatives(1)
    openalex = tmp_path / "openalex"  # the refresh's diff adds a snapshot partition to it
    shutil.copytree(sample_dir() / "openalex", openalex)
    settings = [
        f"storage.root={root}",
        f"storage.s3_endpoint={s3_endpoint}",
        f"input.openalex={openalex}",
        f"refresh.base_release={OLD}",
        f"refresh.api_url={s2_api.api_url}",
        "refresh.requests_per_second=50",
        *small_build(scripted_llm.base_url),
    ]
    creds = {
        k: os.environ[k]
        for k in (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "AWS_EC2_METADATA_DISABLED",
        )
    }
    args = [a for s in settings for a in ("--set", s)]
    # the stages the refresh job needs; every later stage on S3 has its own test (LLM stages,
    # pool, export), here the job and the object store are under test
    submit(
        ray_head,
        "build-1",
        creds,
        "python",
        "jobs/build_dataset.py",
        "--profile",
        "dry-run",
        "--stages",
        "ingest,venues,mine",
        *args,
    )
    submit(
        ray_head,
        "bad-1",
        creds,
        "python",
        "jobs/build_dataset.py",
        "--profile",
        "dry-run",
        *args,
        "--set",
        "mining.top_shar=0.2",
    )

    status, logs = wait(ray_head, "bad-1")
    assert status == "FAILED"
    errors = [line for line in logs.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: invalid config: mining.top_shar: unknown key; allowed here: "
        + errors[0].split("allowed here: ", 1)[1]
    ]
    assert "Traceback" not in logs

    status, logs = wait(ray_head, "build-1")
    assert status == "SUCCEEDED", logs[-3000:]
    assert "mine: run " in logs and f"{root}/mine/_MANIFEST.json" in logs
    assert f"{root}/export/_MANIFEST.json" not in logs  # only the stages asked for
    storage = Storage(load_config("dry-run", env={}, overrides=settings[:2]).storage)
    mined = storage.read_json(f"{root}/mine/_MANIFEST.json")
    assert mined["output"].startswith(f"{root}/mine/runs/")
    loc = storage.resolve(mined["tables"]["pairs"]["uri"])
    assert pq.read_table(loc.path, filesystem=loc.fs).num_rows >= 1

    # the nightly job: a diff at the stand-in applied to the corpus on S3 (what the later stages
    # do with it is test_refresh's; here the job and the object store are under test)
    mine = storage.read_json(f"{root}/mine/_MANIFEST.json")
    pairs = storage.resolve(mine["tables"]["pairs"]["uri"])
    plan = make_diff(
        sample_dir() / "s2",
        openalex,
        s2_api.root,
        pq.read_table(pairs.path, filesystem=pairs.fs),
        releases=(OLD, NEW),
        new=2,
        unpaired_changes=2,
    )
    submit(
        ray_head,
        f"refresh-{NEW}",
        {**creds, "S2_API_KEY": S2StandIn.API_KEY},
        "python",
        "jobs/refresh.py",
        "--profile",
        "dry-run",
        "--corpus-only",
        *args,
    )
    status, logs = wait(ray_head, f"refresh-{NEW}")
    assert status == "SUCCEEDED", logs[-3000:]
    assert f"corpus: S2 {OLD} → {NEW}, 1 release step(s) applied" in logs
    assert S2StandIn.API_KEY not in logs and "Signature" not in logs  # no secret in the logs
    ingest = storage.read_json(f"{root}/ingest/_MANIFEST.json")
    assert ingest["corpus"]["release"] == NEW
    papers = storage.resolve(ingest["tables"]["papers"]["uri"])
    ids = set(
        lance.dataset(ingest["tables"]["papers"]["uri"], storage_options=storage.lance_options())
        .to_table(columns=["corpus_id"])["corpus_id"]
        .to_pylist()
    )
    assert papers.is_s3 and {d for _, d in plan.new_pairs} <= ids and not ids & plan.deleted_papers


def test_a_build_job_whose_driver_is_killed_mid_llm_stage_resumes_paying_only_for_the_rest(
    ray_head, sample_mined, scripted_llm, tmp_path
):
    """`ray job submit` of a build through judge-analogy; once four rows are answered the
    endpoint holds every request and the job's driver is killed (SIGKILL: no handler runs, and
    Ray ends the job's actors with it). The same job submitted again skips the published
    stages, serves the four answers from the cache and asks only for the other rows. The
    requests held at the kill may be billed (the endpoint answers them if their connection
    outlives the driver) and are asked again: paid twice are at most those, and each is in the
    ledger's journal as a request in doubt; the ledger has one valid row per row. (The build is a
    local copy of the mined sample: the object store is the other test's subject.)"""
    rows = 8
    root = copy_build(sample_mined, tmp_path / "build")
    scripted_llm.reset()
    scripted_llm.latency(300)
    settings = [
        f"storage.root={root}",
        # the sample the copy was mined from, by the path it was mined with: the job's own
        # `{sample}` is its working-dir copy of the package, another input to ingest
        f"input.s2={sample_dir() / 's2'}",
        f"input.openalex={sample_dir() / 'openalex'}",
        f"llm.base_url={scripted_llm.base_url}",
        "llm.stages={}",
        "llm.model=scripted",
        "llm.actors=1",
        "llm.max_in_flight=2",
        "llm.inline_max_rows=0",  # actors, ended with the job (a driver's own ask: test_llm_inline)
        f"llm.max_rows_per_stage={rows}",
    ]
    job = [
        "python", "jobs/build_dataset.py", "--profile", "dry-run",
        "--stages", "ingest,venues,mine,judge-analogy",
        *[a for s in settings for a in ("--set", s)],
    ]  # fmt: skip
    submit(ray_head, "judge-1", {}, *job)
    client = jobs_client(ray_head)
    deadline = time.time() + 600
    while scripted_llm.stats().get("answered", 0) < 4:
        running = client.get_job_status("judge-1").value in ("PENDING", "RUNNING")
        assert time.time() < deadline and running, client.get_job_logs("judge-1")[-3000:]
        time.sleep(0.05)
    scripted_llm.pause()
    answered_before = scripted_llm.stats()["answered"]  # no more while paused
    # the answers received reach the cache, then the ledger, at most a flush (FLUSH_S) behind
    deadline = time.time() + 60
    while (stored := flushed_answers(root, "judge-analogy")) != (answered_before,) * 2:
        running = client.get_job_status("judge-1").value in ("PENDING", "RUNNING")
        assert running and time.time() < deadline, (
            f"{answered_before} answered, (cache, ledger) {stored} stored: "
            + client.get_job_logs("judge-1")[-3000:]
        )
        time.sleep(0.05)
    os.kill(int(client.get_job_info("judge-1").driver_info.pid), signal.SIGKILL)
    status, first_logs = wait(ray_head, "judge-1")
    assert status == "FAILED"
    # the requests held at the kill were journaled before they left, and no ledger row settles
    # them: the next run's caps count them, whatever the endpoint does with them now
    storage = Storage(load_config(env={}, overrides=[f"storage.root={root}"]).storage)
    doubt = in_doubt(storage, "judge-analogy").num_rows
    assert 1 <= doubt <= 2  # llm.actors × llm.max_in_flight: at most what was in flight
    scripted_llm.resume()

    submit(ray_head, "judge-2", {}, *job)
    status, logs = wait(ray_head, "judge-2")
    assert status == "SUCCEEDED", logs[-3000:]
    for stage in ("ingest", "venues", "mine"):
        assert f"{stage}: skipped, output of run" in logs
        assert f"{stage}: skipped, output of run" in first_logs  # the copy's, not rebuilt
    judged = json.loads((root / "judge-analogy" / "_MANIFEST.json").read_text())["stats"]
    assert (judged["cached"], judged["asked"]) == (answered_before, rows - answered_before)
    # paid twice: at most the requests in flight at the kill, each in the journal as in doubt
    assert rows <= scripted_llm.stats()["answered"] <= rows + doubt
    ledger = pds.dataset(str(root / "_llm" / "ledger" / "judge-analogy")).to_table()
    keys = ledger.filter(pds.field("status") == "ok")["request_key"].to_pylist()
    assert len(keys) == len(set(keys)) == rows


def test_the_head_refuses_a_job_without_its_token(ray_head, tmp_path):
    """Token authentication as the cluster runs it (RAY_AUTH_MODE=token on the head): `ray job
    submit` without the token, or with another, is refused and nothing runs; the job API answers
    only with it. The nightly submitter stops at once, in one line, when it has no token."""
    entrypoint = ["--", "python", "-c", "print('ran')"]
    no_token = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    out = subprocess.run(
        [RAY, "job", "submit", "--address", ray_head, "--submission-id", "anon-1", *entrypoint],
        env={**no_token, "HOME": str(tmp_path)},  # no ~/.ray/auth_token either
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0, out.stdout
    assert "Unauthorized: Missing authentication token" in out.stderr, out.stderr
    wrong = urllib.request.Request(
        f"{ray_head}/api/jobs/",
        data=json.dumps({"entrypoint": "python -c 1", "submission_id": "anon-2"}).encode(),
        headers={"Authorization": "Bearer not-the-token", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(wrong, timeout=30)
    assert refused.value.code == 403
    submitted = {job.submission_id for job in jobs_client(ray_head).list_jobs()}
    assert not {"anon-1", "anon-2"} & submitted

    script = ROOT / "infra" / "launcher" / "submit-refresh.sh"
    out = subprocess.run(
        ["bash", str(script)],
        env={**no_token, "RAY_ADDRESS": ray_head, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "error: no Ray token: set RAY_AUTH_TOKEN_PATH to the file holding the cluster's "
        "(SSM /cpr-ray/RAY_AUTH_TOKEN; infra/README.md)"
    ]


def test_the_nightly_script_waits_for_the_refresh_and_fails_with_its_cause(ray_head, tmp_path):
    """infra/launcher/submit-refresh.sh against the head, as systemd runs it: it submits the
    night's refresh, follows it to its end and, the job failing, exits 1 with the job log's last
    line (the cause) as its own, for OnFailure= and cron to alert on; run again the same day it
    follows that job instead of submitting another."""
    config = tmp_path / "refresh.yaml"
    config.write_text("mining:\n  top_shar: 0.2\n")  # a typo: the job fails as it starts
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_head,
        **WITH_TOKEN,
        "CPR_RAY_CHECKOUT": str(ROOT),
        "CPR_REFRESH_CONFIG": str(config),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    script = str(ROOT / "infra" / "launcher" / "submit-refresh.sh")
    today = "refresh-" + time.strftime("%Y-%m-%d", time.gmtime())
    runs = []
    deadline = time.time() + 180
    while len(runs) < 2:
        run = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=300)
        starting = "No available agent" in run.stderr or "status code 503" in run.stderr
        if starting and not runs and time.time() < deadline:  # the head's job agent is not up
            time.sleep(2)
            continue
        runs.append(run)
    for run in runs:
        assert run.returncode == 1, run.stdout + run.stderr
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{today} FAILED: error: invalid config: mining.top_shar: "), last
    assert f"submitting {today} at commit " in runs[0].stdout
    assert f"{today} was already submitted; following it" in runs[1].stdout
