"""cluster.yaml (the Ray cluster launcher config for AWS), offline: Ray's own validator accepts it,
and it keeps the properties the jobs and infra/README.md rely on."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from cpr_ray.config import EncoderActors, load_config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_YAML = ROOT / "cluster.yaml"
# what encoder.resources_per_actor and train.resources_per_worker ask for
GPU_NODE_RESOURCE = "cpr_gpu_node"
# the images of infra/image/Dockerfile (its targets cpu and gpu), in the registry of the account
# and region `render` fills in (infra/README.md), tagged with the commit they were built from
IMAGE = re.compile(r"ACCOUNT_ID\.dkr\.ecr\.us-west-2\.amazonaws\.com/cpr-ray:COMMIT_SHA-(cpu|gpu)")

# What a leaked credential looks like in a config file or script. An API-key variable may be
# named, and may be assigned from a command or another variable ("$..."), never given a value.
CREDENTIAL_PATTERNS = {
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret key setting": re.compile(r"aws_secret_access_key", re.IGNORECASE),
    "OpenAI-style key": re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),
    "API key with a literal value": re.compile(
        r"\b(OPENAI_API_KEY|S2_API_KEY)[ \t]*[=:][ \t]*[\"']?(?!\$)[^\s\"'$]+[\"']?[ \t]*(#.*)?$",
        re.MULTILINE,
    ),
    "private key block": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
}


def find_credentials(text: str) -> list[str]:
    """Names of the credential patterns found in `text`, with the offending snippet."""
    return [
        f"{name}: {match.group(0)!r}"
        for name, pattern in CREDENTIAL_PATTERNS.items()
        for match in pattern.finditer(text)
    ]


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def _images(raw: dict) -> dict[str, str]:
    """Where each node type's container image comes from, after Ray's own precedence rules."""
    docker = raw["docker"]
    images = {}
    for name, node in raw["available_node_types"].items():
        if name == raw["head_node_type"]:
            images[name] = docker.get("head_image", docker["image"])
        else:
            default = docker.get("worker_image", docker["image"])
            images[name] = node.get("docker", {}).get("worker_image", default)
    return images


def test_cluster_yaml_is_valid_for_ray_up(raw):
    validate_config(prepare_config(copy.deepcopy(raw)))
    nodes = raw["available_node_types"]
    assert raw["head_node_type"] in nodes
    for name, node in nodes.items():
        if name != raw["head_node_type"]:
            assert node["min_workers"] == 0 <= node["max_workers"], name  # autoscale from zero
    assert sum(n.get("max_workers", 0) for n in nodes.values()) <= raw["max_workers"]


def test_the_validator_can_fail(raw):
    broken = yaml.safe_load(CLUSTER_YAML.read_text())
    broken["idle_timout_minutes"] = 5  # typo: the schema closes the top level
    with pytest.raises(Exception, match="idle_timout_minutes"):
        validate_config(prepare_config(broken))
    broken = yaml.safe_load(CLUSTER_YAML.read_text())
    broken["available_node_types"]["gpu_worker"]["resources"][GPU_NODE_RESOURCE] = "100"
    with pytest.raises(Exception, match="is not of type 'integer'"):
        validate_config(prepare_config(broken))


def test_head_takes_no_work_and_workers_split_by_kind(raw):
    nodes = raw["available_node_types"]
    assert nodes[raw["head_node_type"]]["resources"]["CPU"] == 0
    cpu = nodes["cpu_worker"]
    assert cpu["resources"]["CPU"] > 0 and not cpu["resources"].get("GPU")
    assert cpu["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    gpu = nodes["gpu_worker"]
    assert gpu["resources"]["GPU"] >= 1
    assert gpu["resources"][GPU_NODE_RESOURCE] >= 1
    offering = [name for name, node in nodes.items() if GPU_NODE_RESOURCE in node["resources"]]
    assert offering == ["gpu_worker"]  # encoder actors can land nowhere else
    assert raw["idle_timeout_minutes"] > 0


def test_nodes_run_the_images_and_a_pinned_ami(raw):
    images = _images(raw)
    kinds = {name: IMAGE.fullmatch(ref).group(1) for name, ref in images.items()}
    gpu = {n for n, node in raw["available_node_types"].items() if node["resources"].get("GPU")}
    assert kinds == {name: "gpu" if name in gpu else "cpu" for name in images}
    assert raw["docker"]["pull_before_run"] is True
    region = raw["provider"]["region"]
    (login,) = raw["initialization_commands"]  # on the host, before it pulls an image
    assert f"aws ecr get-login-password --region {region} |" in login
    assert f"ACCOUNT_ID.dkr.ecr.{region}.amazonaws.com" in login
    for name, node in raw["available_node_types"].items():
        assert node["node_config"]["ImageId"] == "AMI_ID", name  # rendered to one pinned id


def test_nodes_install_nothing_when_they_start(raw):
    prepared = prepare_config(copy.deepcopy(raw))
    commands = [
        c
        for key in ("setup_commands", "head_setup_commands", "worker_setup_commands")
        for c in prepared.get(key, [])
    ]
    for node in raw["available_node_types"].values():
        commands += node.get("worker_setup_commands", [])
    commands += prepared["head_start_ray_commands"] + prepared["worker_start_ray_commands"]
    commands += prepared.get("initialization_commands", [])
    installs = re.compile(r"\b(pip|uv|conda|mamba|apt-get|apt)\b.*\binstall\b|\btorch\b")
    assert [c for c in commands if installs.search(c)] == []
    assert prepared["setup_commands"] == prepared["head_setup_commands"] == []
    assert prepared["worker_setup_commands"] == []

    # file_mounts still brings the checkout (node-env.sh), not the .venv or build outputs
    mounted = [remote for remote, local in raw["file_mounts"].items() if local in (".", "./")]
    assert len(mounted) == 1, raw["file_mounts"]
    assert ".gitignore" in raw["rsync_filter"]


def test_start_commands_load_the_keys_before_ray_starts(raw):
    remote_root = next(r for r, local in raw["file_mounts"].items() if local in (".", "./"))
    for key, role in (("head_start_ray_commands", "head"), ("worker_start_ray_commands", "worker")):
        start = [c for c in raw[key] if "ray start" in c]
        assert len(start) == 1, raw[key]
        sourced = re.match(rf"source (\S+) {role} && ray start ", start[0])
        assert sourced, start[0]
        script = Path(sourced.group(1)).relative_to(remote_root.rstrip("/"))
        assert (ROOT / script).is_file(), script  # synced along with the checkout


def test_no_credentials_in_the_file(raw):
    assert "aws_credentials" not in raw["provider"]
    text = CLUSTER_YAML.read_text()
    assert find_credentials(text) == []
    # the region the containers' AWS clients use is the cluster's
    region_opts = [o for o in raw["docker"]["run_options"] if "AWS_DEFAULT_REGION=" in o]
    assert region_opts == [f"--env AWS_DEFAULT_REGION={raw['provider']['region']}"]


def test_the_credential_scan_can_fail():
    assert find_credentials("aws_access_key_id = AKIAABCDEFGHIJKLMNOP")
    assert find_credentials("OPENAI_API_KEY=abc123")
    assert find_credentials("env:\n  OPENAI_API_KEY: hunter2\n")
    assert find_credentials("aws_secret_access_key: x")
    assert find_credentials("export S2_API_KEY='abc123'  # temporary")
    harmless = 'OPENAI_API_KEY="$(fetch key)"\nS2_API_KEY=$VALUE\n- name: S2_API_KEY\n'
    assert not find_credentials(harmless + "# OPENAI_API_KEY: read from SSM\n")


def _fits(ask: dict[str, float], node: dict[str, float]) -> bool:
    return all(0 < amount <= node.get(name, 0) for name, amount in ask.items())


def ray_asks(pool: EncoderActors) -> dict[str, float]:
    """What each of `pool`'s actors asks Ray for, as Ray names the resources."""
    ask = pool.ray_resources()
    return {"CPU": ask["num_cpus"], "GPU": ask["num_gpus"], **ask.get("resources", {})}


def gpu_stage_asks() -> dict[str, dict[str, float]]:
    """What each stage that can use a GPU asks Ray for, per actor or worker, under
    `--profile cluster`, resolved as each command resolves it: the poolers' encoder and search
    actors (build), `cpr index`'s encoder actors (jobs/index.py), `cpr eval`'s for a dense or
    SPLADE retriever (jobs/evaluate.py) and Ray Train's workers (jobs/train.py)."""
    from cpr_ray.evaluate.eval_config_check import check
    from cpr_ray.pooling.poolers import plans
    from cpr_ray.retrieval.factory import make_retriever
    from cpr_ray.retrieval.spec import RetrieverOptions
    from cpr_ray.runs.command_options import Given
    from cpr_ray.train.train_command import REQUIRED
    from cpr_ray.train.trainer import default_cpus_per_worker, worker_resources

    asks: dict[str, dict[str, float]] = {}
    build = load_config("cluster", env={})
    for plan in plans(build.pooling):
        if plan.spec is not None:  # bm25 encodes nothing
            asks[f"pool {plan.name}"] = ray_asks(plan.pool)
    assert len(asks) == 3  # E5, SPLADE-v3, SciNCL

    flags = {"search.corpus": "s3://b/export", "search.out": "s3://b/index"}
    opts = RetrieverOptions.from_config(Given(None, "cluster", (), flags).load()).ray  # cpr index's
    asks["index"] = ray_asks(opts)

    for retriever in ("dense", "splade"):
        flags = {"eval.benchmark": "cpr", "eval.data": "s3://b/export", "eval.retriever": retriever}
        cfg = Given(None, "cluster", (), flags).load(check=check)
        made = make_retriever(retriever, cfg.encoder.model, RetrieverOptions.from_config(cfg))
        opts = made.options.ray  # what its documents are encoded on, past eval.ray_min_docs
        asks[f"eval {retriever}"] = ray_asks(opts)

    flags = {"train.data": "s3://b/export", "train.out": "s3://b/run", "encoder.model": "m"}
    tc = Given(None, "cluster", (), flags).load(required=REQUIRED).train
    assert tc.use_gpu
    cluster = load_config("cluster", env={})
    placed = tc.model_copy(update={"cpus_per_worker": default_cpus_per_worker(cluster, 0.0)})
    asks["train"] = worker_resources(placed)
    return asks


def test_every_gpu_stage_of_the_cluster_profile_asks_for_a_gpu_worker_and_fits_one(raw):
    """Every stage that can use a GPU (gpu_stage_asks) asks Ray for one, with the resource only
    the GPU node type offers, and what it asks fits that node type."""
    gpu_node = raw["available_node_types"]["gpu_worker"]["resources"]
    for stage, ask in gpu_stage_asks().items():
        assert ask["GPU"] >= 1, (stage, ask)
        assert ask[GPU_NODE_RESOURCE] >= 1, (stage, ask)
        assert _fits(ask, gpu_node), (stage, ask, gpu_node)


def test_the_fit_check_can_fail(raw):
    gpu_node = raw["available_node_types"]["gpu_worker"]["resources"]
    assert _fits({"CPU": 4, "GPU": 1, GPU_NODE_RESOURCE: 1}, gpu_node)
    assert not _fits({"CPU": 16, "GPU": 1, GPU_NODE_RESOURCE: 1}, gpu_node)  # a cpu_worker's
    assert not _fits({"CPU": 1, "GPU": 2}, gpu_node)
    assert not _fits({"CPU": 1, "GPU": 1, "other_node": 1}, gpu_node)
