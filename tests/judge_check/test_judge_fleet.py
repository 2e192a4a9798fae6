"""The judge fleet offline (infra/judges/, infra/serve/judges.yaml): its Serve application parses
with Ray Serve's and Ray Serve LLM's own schemas, serves every model the cluster profile names on
GPUs it fits, and is reached over https; and the sizing arithmetic behind it and behind
benchmarks/SCALE.md's table (cpr_ray/judge_check/fleet.py). The manifests' Kubernetes and
KubeRay schemas are checked in tests/infra/test_infra_manifests.py."""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import ValidationError

from cpr_ray.config import LLM_STAGES, load_config
from cpr_ray.judge_check import fleet
from cpr_ray.judge_check.fleet import GPUS, INSTANCES, MODELS, replica_fit
from cpr_ray.judge_check.projection import LEDGER_MEANS

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "infra" / "serve" / "judges.yaml"
JUDGES = ROOT / "infra" / "judges"


def _serve_config() -> dict:
    return yaml.safe_load(SERVE.read_text())


def _llm_configs() -> dict[str, dict]:
    """The served models' LLMConfig dicts, by the name clients ask for."""
    (app,) = _serve_config()["applications"]
    return {c["model_loading_config"]["model_id"]: c for c in app["args"]["llm_configs"]}


def _manifest(name: str) -> dict:
    return yaml.safe_load((JUDGES / name).read_text())


def _judge_group() -> dict:
    (group,) = _manifest("judges-rayservice.yaml")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return group


def _llm_config_model():
    # Ray Serve LLM's own model; its package module needs vLLM, this one does not
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    return LLMConfig


# --- the Serve application -------------------------------------------------------------------


def test_the_rayservice_runs_the_serve_config():
    rayservice = _manifest("judges-rayservice.yaml")
    assert yaml.safe_load(rayservice["spec"]["serveConfigV2"]) == _serve_config()


def test_the_serve_config_parses_with_rays_schemas():
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import DeploymentSchema, ServeDeploySchema

    (app,) = ServeDeploySchema.model_validate(_serve_config()).applications
    # the builder exists where import_path says (its module imports vLLM, absent here)
    module, attr = app.import_path.split(":")
    source = Path(importlib.util.find_spec(module).origin).read_text()
    builders = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == attr
    ]
    assert len(builders) == 1 and len(builders[0].args.args) == 1
    assert set(app.args) == {"llm_configs"}  # LLMServingArgs, the builder's one argument

    llm_config = _llm_config_model()
    for raw in app.args["llm_configs"]:
        parsed = llm_config.model_validate(raw)  # unknown keys and accelerator types refused
        assert parsed.model_id == raw["model_loading_config"]["model_source"]
        deployment = raw["deployment_config"]
        assert set(deployment) <= set(DeploymentSchema.model_fields)
        autoscaling = deployment["autoscaling_config"]
        assert set(autoscaling) <= set(AutoscalingConfig.model_fields)
        scaling = AutoscalingConfig.model_validate(autoscaling)
        assert 1 <= scaling.min_replicas <= scaling.max_replicas
        # a replica takes at least the requests autoscaling aims it at
        assert deployment["max_ongoing_requests"] >= scaling.target_ongoing_requests


def test_the_llm_config_check_can_fail():
    llm_config = _llm_config_model()
    good = next(iter(_llm_configs().values()))
    with pytest.raises(ValidationError, match="engine_kwarg"):
        llm_config.model_validate({**good, "engine_kwarg": good["engine_kwargs"]})
    with pytest.raises(ValidationError, match="Unsupported accelerator type"):
        llm_config.model_validate({**good, "accelerator_type": "L40"})


# --- every judge is served, on GPUs it fits --------------------------------------------------


def test_every_model_the_cluster_profile_names_is_served_on_gpus_it_fits():
    cfg = load_config("cluster", env={})
    asked = {stage: cfg.llm.for_stage(stage) for stage in LLM_STAGES}
    served = _llm_configs()
    assert {model for model, _, _ in asked.values()} == set(served)  # nothing else loaded

    group = _judge_group()
    pod = group["template"]["spec"]
    gpu_name, gpus = INSTANCES[pod["nodeSelector"]["node.kubernetes.io/instance-type"]]
    (container,) = pod["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == gpus  # the whole node

    nodes_at = {}  # model -> (nodes at min replicas, nodes at max replicas)
    for model, raw in served.items():
        engine = raw["engine_kwargs"]
        tp = engine["tensor_parallel_size"]
        assert raw["accelerator_type"] == gpu_name
        assert raw["placement_group_config"]["strategy"] == "STRICT_PACK" and tp <= gpus
        fit = replica_fit(
            MODELS[model],
            GPUS[gpu_name],
            tp,
            max_model_len=engine["max_model_len"],
            gpu_memory_utilization=engine["gpu_memory_utilization"],
        )
        assert fit.fits, (model, fit)
        for stage, (asked_model, _, max_tokens) in asked.items():
            prompt = LEDGER_MEANS.get(stage, (1, 1344, 0))[1]  # else the longest
            if asked_model == model:
                needed = fleet.longest_conversation(prompt, max_tokens, cfg.llm.max_reasks)
                assert needed <= engine["max_model_len"], (stage, needed)
        scaling = raw["deployment_config"]["autoscaling_config"]
        per_node = gpus // tp
        nodes_at[model] = tuple(
            math.ceil(scaling[k] / per_node) for k in ("min_replicas", "max_replicas")
        )
    # the build asks one model at a time: the busiest at its max, the others at their min
    peak = max(
        busy[1] + sum(other[0] for name, other in nodes_at.items() if name != model)
        for model, busy in nodes_at.items()
    )
    assert group["minReplicas"] == 0 and group["maxReplicas"] == peak


def test_the_judge_endpoint_is_https_through_the_ingress():
    ingress = _manifest("judges-ingress.yaml")
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    rayservice = _manifest("judges-rayservice.yaml")
    assert path["backend"]["service"] == {
        "name": f"{rayservice['metadata']['name']}-serve-svc",  # what KubeRay names it
        "port": {"number": 8000},
    }
    annotations = ingress["metadata"]["annotations"]
    assert annotations["alb.ingress.kubernetes.io/listen-ports"] == '[{"HTTPS": 443}]'
    assert annotations["alb.ingress.kubernetes.io/scheme"] == "internal"
    assert [rule["host"]] == ingress["spec"]["tls"][0]["hosts"]

    fleet_url = urlsplit(load_config("cluster", env={}).llm.base_url)
    assert (fleet_url.scheme, fleet_url.hostname, fleet_url.path) == ("https", rule["host"], "/v1")
    # the provider alternative: the same judges by name, over https too
    hosted = load_config("cluster-hosted", env={}).llm
    assert urlsplit(hosted.base_url).scheme == "https"
    cluster = load_config("cluster", env={}).llm
    assert {s: hosted.for_stage(s) for s in LLM_STAGES} == {
        s: cluster.for_stage(s) for s in LLM_STAGES
    }


# --- the sizing arithmetic -------------------------------------------------------------------


def test_replica_fit_is_weights_plus_working_memory_plus_kv_cache():
    l40s, qwen = GPUS["L40S"], MODELS["Qwen/Qwen3-32B"]
    usable = 46068 / 1024 * 0.9  # GiB of one L40S that vLLM takes
    weights = 32.8e9 * 2 / 2**30  # bf16
    kv_per_token = 2 * 64 * 8 * 128 * 2  # K and V, 64 layers, 8 KV heads of 128, bf16
    fit = replica_fit(qwen, l40s, 4, max_model_len=8192)
    expected = (usable - weights / 4 - fleet.OVERHEAD_GIB) * 4 * 2**30 // kv_per_token
    assert fit.kv_tokens == int(expected) and fit.fits
    assert fit.sequences(2268) == fit.kv_tokens // 2268 > 100  # judge-analogy's requests

    assert not replica_fit(qwen, l40s, 1, max_model_len=8192).fits  # weights alone overflow
    assert replica_fit(qwen, l40s, 1, max_model_len=8192).kv_tokens == 0
    llama = MODELS["meta-llama/Llama-3.3-70B-Instruct"]
    assert not replica_fit(llama, l40s, 2, max_model_len=8192).fits
    assert replica_fit(llama, l40s, 4, max_model_len=8192).fits
    # a KV cache too small for one max_model_len sequence fails as vLLM would
    tight = replica_fit(llama, l40s, 4, max_model_len=8192, gpu_memory_utilization=0.79)
    assert 0 < tight.kv_tokens < 8192 and not tight.fits


def test_throughput_scales_with_bandwidth_over_parameters():
    ref = fleet.REFERENCE
    qwen = MODELS["Qwen/Qwen3-32B"]
    assert fleet.tokens_per_gpu_second(qwen, GPUS[ref["gpu"]]) == pytest.approx(ref["tokens_per_s"])
    assert fleet.tokens_per_gpu_second(qwen, GPUS["H100"]) == pytest.approx(1731 * 3350 / 2039)
    llama = MODELS["meta-llama/Llama-3.3-70B-Instruct"]
    assert fleet.tokens_per_gpu_second(llama, GPUS["A100-80G"]) == pytest.approx(1731 * 32.8 / 70.6)


def test_scale_md_sizing_table_is_the_arithmetic_for_this_fleet():
    cfg = load_config("cluster", env={})
    stage_models = {stage: cfg.llm.for_stage(stage)[0] for stage in fleet.FLEET_STAGES}
    gpus_per_model = {
        model: raw["engine_kwargs"]["tensor_parallel_size"]
        * raw["deployment_config"]["autoscaling_config"]["max_replicas"]
        for model, raw in _llm_configs().items()
    }
    loads = fleet.build_load(stage_models, GPUS["L40S"], gpus_per_model)
    assert [load.stage for load in loads] == list(fleet.FLEET_STAGES)
    analogy = loads[0]
    assert analogy.tokens == 132_000 * (1344 + 924)
    assert analogy.gpu_hours == round(analogy.tokens / (1731 * 864 / 2039) / 3600, 1)

    # nodes held while a model works: its replicas at their most, each other model's at fewest
    per_node = {
        m: 4 // raw["engine_kwargs"]["tensor_parallel_size"] for m, raw in _llm_configs().items()
    }
    replica_nodes = {
        model: tuple(
            math.ceil(raw["deployment_config"]["autoscaling_config"][k] / per_node[model])
            for k in ("min_replicas", "max_replicas")
        )
        for model, raw in _llm_configs().items()
    }
    # the price the spend ledger charges: the profile's, for the judge group's instance type,
    # on at most the group's nodes
    group = _judge_group()
    assert group["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == (
        "g6e.12xlarge"
    )
    assert cfg.llm.fleet.nodes == group["maxReplicas"]
    price = cfg.llm.fleet.node_hour_usd
    scale_md = (ROOT / "benchmarks" / "SCALE.md").read_text()
    total_node_hours = 0.0
    for load in loads:
        held = fleet.nodes_held(replica_nodes, load.model)
        node_hours = fleet.node_hours(load, replica_nodes)
        assert node_hours == round(load.wall_hours * held, 1)
        total_node_hours += node_hours
        row = (
            f"| {load.stage} | {load.model} | {load.tokens / 1e6:.1f}M | {load.gpu_hours} | "
            f"{gpus_per_model[load.model]} | {load.wall_hours} | {held} | {node_hours} | "
            f"{round(node_hours * price)} |"
        )
        assert row in scale_md
    # the fleet's peak is the judge group's most replicas, and the totals the text gives
    assert max(fleet.nodes_held(replica_nodes, m) for m in replica_nodes) == 6
    assert f"{total_node_hours:.1f} node-hours and ${round(total_node_hours * price)}" in (
        " ".join(scale_md.split())
    )
