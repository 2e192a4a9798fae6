"""infra/launcher/node-env.sh as cluster.yaml runs it (`source node-env.sh ROLE && ray start`),
in bash, against moto's SSM on loopback: each role gets exactly the secrets its processes use,
a parameter the node may go without never stops `ray start`, one it needs stops it with one line
naming the parameter, and each role's IAM policy grants exactly what the script reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "infra" / "launcher"
SCRIPT = LAUNCHER / "node-env.sh"
REGION = "us-west-2"
VALUES = {
    "RAY_AUTH_TOKEN": "ray-token-0",
    "OPENAI_API_KEY": "llm key with spaces and 'quotes'",
    "S2_API_KEY": "s2-key-0",
    "CPR_SEARCH_API_KEY": "search-key-0",
}
# what `ray start` would inherit: these, and RAY_AUTH_MODE
SECRETS = set(VALUES)
STARTED = "ray-start-ran"


@pytest.fixture()
def ssm(s3_endpoint: str):
    """(client, prefix): moto's SSM (the session's moto server serves every service) under a
    prefix of this test's own."""
    client = boto3.client(
        "ssm",
        endpoint_url=s3_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return client, f"/cpr-test-{uuid.uuid4().hex[:8]}"


def _put(ssm, *names: str) -> None:
    client, prefix = ssm
    for name in names:
        client.put_parameter(
            Name=f"{prefix}/{name}", Value=VALUES[name], Type="SecureString", Overwrite=True
        )


def _start(ssm, endpoint: str, role: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """`source node-env.sh ROLE && ray start` in bash, with `ray start` standing in as a line that
    says it ran and the environment it would inherit (NUL-separated)."""
    _, prefix = ssm
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_SSM": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "CPR_SSM_PREFIX": prefix,
    }
    command = f"source {SCRIPT} {role} && echo {STARTED} && env -0"
    out = subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60
    )
    exported = {}
    if STARTED in out.stdout:
        body = out.stdout.split(STARTED + "\n", 1)[1]
        exported = dict(item.split("=", 1) for item in body.split("\0") if "=" in item)
    return out, exported


def _secrets(exported: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in exported.items() if k in SECRETS}


def test_each_role_gets_what_it_uses_and_the_head_starts_without_the_search_key(s3_endpoint, ssm):
    _put(ssm, "RAY_AUTH_TOKEN", "OPENAI_API_KEY", "S2_API_KEY")  # no search service yet
    out, exported = _start(ssm, s3_endpoint, "head")
    assert out.returncode == 0, out.stderr
    assert _secrets(exported) == {
        k: VALUES[k] for k in ("RAY_AUTH_TOKEN", "OPENAI_API_KEY", "S2_API_KEY")
    }
    assert exported["RAY_AUTH_MODE"] == "token"
    (note,) = out.stderr.splitlines()
    assert note.startswith("note: ") and f"{ssm[1]}/CPR_SEARCH_API_KEY" in note

    _put(ssm, "CPR_SEARCH_API_KEY")
    out, exported = _start(ssm, s3_endpoint, "head")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert _secrets(exported) == VALUES

    # a worker never holds the S2 or the search service's key, though SSM has them
    out, exported = _start(ssm, s3_endpoint, "worker")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert _secrets(exported) == {k: VALUES[k] for k in ("RAY_AUTH_TOKEN", "OPENAI_API_KEY")}
    assert exported["RAY_AUTH_MODE"] == "token"

    # a shell that only talks to Ray (`ray status` on a node) holds only Ray's token
    out, exported = _start(ssm, s3_endpoint, "client")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert _secrets(exported) == {"RAY_AUTH_TOKEN": VALUES["RAY_AUTH_TOKEN"]}
    assert exported["RAY_AUTH_MODE"] == "token"


def test_a_worker_starts_without_the_heads_parameters(s3_endpoint, ssm):
    _put(ssm, "RAY_AUTH_TOKEN", "OPENAI_API_KEY")
    out, exported = _start(ssm, s3_endpoint, "worker")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert set(_secrets(exported)) == {"RAY_AUTH_TOKEN", "OPENAI_API_KEY"}


def test_a_missing_needed_parameter_stops_ray_start_in_one_line(s3_endpoint, ssm):
    _put(ssm, "RAY_AUTH_TOKEN", "OPENAI_API_KEY", "CPR_SEARCH_API_KEY")
    out, exported = _start(ssm, s3_endpoint, "head")
    assert out.returncode != 0 and exported == {} and STARTED not in out.stdout
    assert out.stderr.splitlines() == [
        f"error: SSM parameter {ssm[1]}/S2_API_KEY not set; this node needs it "
        "(infra/README.md, the SSM parameters step)"
    ]

    out, _ = _start(ssm, s3_endpoint, "nobody")
    assert out.returncode != 0 and STARTED not in out.stdout
    assert out.stderr.splitlines() == [
        "error: node-env.sh needs the node's role: source node-env.sh head|worker|client"
    ]


def test_unreachable_ssm_stops_ray_start_in_one_line(ssm):
    out, _ = _start(ssm, "http://127.0.0.1:9", "worker")  # nothing listens on the discard port
    assert out.returncode != 0 and STARTED not in out.stdout
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: cannot read the SSM parameters ") and "RAY_AUTH_TOKEN" in line


def _role_exports(ssm, endpoint: str, role: str) -> set[str]:
    """The secrets a role reads, seen from outside: every parameter in SSM, what it exports."""
    _put(ssm, *VALUES)
    out, exported = _start(ssm, endpoint, role)
    assert out.returncode == 0, out.stderr
    return set(_secrets(exported))


def test_cluster_yaml_sources_each_role_and_its_policy_grants_exactly_that(s3_endpoint, ssm):
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    for key, role in (("head_start_ray_commands", "head"), ("worker_start_ray_commands", "worker")):
        (start,) = [c for c in launcher[key] if "ray start" in c]
        assert re.match(rf"source \S+/infra/launcher/node-env\.sh {role} && ray start ", start)

    profiles = {
        name: node["node_config"]["IamInstanceProfile"]["Name"]
        for name, node in launcher["available_node_types"].items()
    }
    head = launcher["head_node_type"]
    assert {p for n, p in profiles.items() if n != head} == {"cpr-ray-node"}
    assert profiles[head] == "cpr-ray-head"
    for role in ("head", "worker"):
        policy = json.loads((LAUNCHER / f"iam-policy-secrets-{role}.json").read_text())
        (statement,) = policy["Statement"]
        assert statement["Action"] == ["ssm:GetParameters"]
        granted = {r.split(":parameter/cpr-ray/", 1)[1] for r in statement["Resource"]}
        assert granted == _role_exports(ssm, s3_endpoint, role), role
