"""Path A starts from zero nodes: every Ray request placed by Ray's own KubeRay autoscaler code on
a worker group as its spec advertises it before any pod exists, every pod placed by the Cluster
Autoscaler's template node of its EKS node group (infra/eks/nodegroups.yaml), the heads that run
at once on the head group, and the EC2 vCPU quotas the groups need (cpr_ray/capacity.py)."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stdout

import pytest
import yaml

from cpr_ray import capacity
from cpr_ray.capacity import (
    advertised_node_types,
    misfits,
    node_groups,
    placement_demands,
    serve_llm_placement,
    unplaceable,
)
from tests.infra.test_cluster_config import gpu_stage_asks
from tests.infra.test_infra_manifests import INFRA, KUBERAY, KUBERAY_JOBS, _pod_specs

GROUPS = node_groups()


def _cluster(doc: dict) -> dict:
    spec = doc["spec"].get("jobTemplate", doc["spec"])
    return spec.get("rayClusterSpec") or spec["rayClusterConfig"]


def _fleet() -> dict:
    (doc,) = [d for _, d in KUBERAY if d["kind"] == "RayService"]
    return doc


def _llm_configs(fleet: dict) -> list[dict]:
    (app,) = yaml.safe_load(fleet["spec"]["serveConfigV2"])["applications"]
    return app["args"]["llm_configs"]


def _fleet_demands(fleet: dict) -> dict[str, list[dict]]:
    return {
        cfg["model_loading_config"]["model_id"]: placement_demands(*serve_llm_placement(cfg))
        for cfg in _llm_configs(fleet)
    }


# --- Ray's KubeRay autoscaler ----------------------------------------------------------------


def test_every_judge_replica_scales_a_worker_group_up_from_zero():
    fleet = _fleet()
    node_types = advertised_node_types(_cluster(fleet))
    for model, demands in _fleet_demands(fleet).items():
        assert any(k.startswith("accelerator_type:") for d in demands for k in d), model
        assert unplaceable(node_types, demands) == [], model
    for name, node_type in node_types.items():
        if name != capacity.HEAD_GROUP:
            assert node_type["min_workers"] == 0, name


def test_a_group_that_does_not_advertise_the_accelerator_strands_the_fleet():
    """The operator's finding: `rayStartParams: {}` on the judge group leaves every replica's
    `accelerator_type:L40S` unknown to Ray until a node runs, and none ever starts."""
    fleet = copy.deepcopy(_fleet())
    for group in _cluster(fleet)["workerGroupSpecs"]:
        group["rayStartParams"] = {}
    node_types = advertised_node_types(_cluster(fleet))
    for model, demands in _fleet_demands(fleet).items():
        assert unplaceable(node_types, demands) == demands, model


@pytest.mark.parametrize("where, doc", KUBERAY_JOBS, ids=[w for w, _ in KUBERAY_JOBS])
def test_every_job_request_scales_a_worker_group_up_from_zero(where, doc):
    """The cluster profile's GPU stages (encoder and search actors, train workers), a CPU task,
    and the job's entrypoint (the driver, on the head), on the job's cluster as Ray's KubeRay
    autoscaler sees it with no workers."""
    node_types = advertised_node_types(_cluster(doc))
    spec = doc["spec"].get("jobTemplate", doc["spec"])
    entrypoint = {
        "CPU": spec.get("entrypointNumCpus", 0),
        "GPU": spec.get("entrypointNumGpus", 0),
        **(yaml.safe_load(spec.get("entrypointResources") or "{}")),
    }
    demands = [*gpu_stage_asks().values(), {"CPU": 1.0}]
    if any(entrypoint.values()):
        demands.append({k: v for k, v in entrypoint.items() if v})
    assert unplaceable(node_types, demands) == []
    # and nothing GPU-bound lands on a CPU group: only the GPU group offers cpr_gpu_node
    offering = [n for n, t in node_types.items() if t["resources"].get("cpr_gpu_node")]
    assert offering == ["gpu"], where


# --- the Cluster Autoscaler's template nodes -------------------------------------------------


def _all_pods() -> list[tuple[str, dict]]:
    pods = []
    for where, doc in KUBERAY:
        spec = doc["spec"].get("jobTemplate", doc["spec"])
        for group, pod in _pod_specs(spec).items():
            pods.append((f"{where}:{group}", pod))
    return pods


@pytest.mark.parametrize("where, pod", _all_pods(), ids=[w for w, _ in _all_pods()])
def test_every_ray_pod_scales_its_node_group_up_from_zero(where, pod):
    (group,) = capacity.matching_groups(pod, GROUPS)
    assert group.min_size == 0 < group.max_size
    assert misfits(pod, group) == [], (where, group.name)


def test_template_tags_promise_no_more_than_a_node_gives():
    for group in GROUPS:
        node = capacity.template_node(group)
        assert node.ephemeral_storage <= capacity.kubelet_ephemeral_storage(group), group.name
        largest = max(capacity.INSTANCES[t].gpus for t in group.instance_types)
        smallest = min(capacity.INSTANCES[t].gpus for t in group.instance_types)
        assert smallest <= node.gpus <= largest, group.name  # the device plugin's count


def test_the_template_check_can_fail():
    """The operator's finding: a worker asking for ephemeral storage, on a group whose tags do not
    say it has any; and a group that does not propagate its labels and taints."""
    (worker,) = [p for w, p in _all_pods() if w.startswith("k8s/20") and w.endswith(":gpu")]
    (gpu,) = [g for g in GROUPS if g.name == "cpr-gpu"]
    untagged = capacity.NodeGroup(**{**gpu.__dict__, "tags": {}})
    assert any(m.startswith("ephemeral-storage") for m in misfits(worker, untagged))
    assert any(m.startswith("nvidia.com/gpu") for m in misfits(worker, untagged))
    unpropagated = capacity.NodeGroup(**{**gpu.__dict__, "propagate_tags": False})
    assert any("cpr-ray/pool" in m for m in misfits(worker, unpropagated))


def test_worker_groups_hold_the_largest_ray_group_that_selects_them():
    for where, doc in KUBERAY:
        for spec in _cluster(doc)["workerGroupSpecs"]:
            (group,) = capacity.matching_groups(spec["template"]["spec"], GROUPS)
            assert spec["maxReplicas"] <= group.max_size, (where, group.name)


def test_the_heads_that_run_at_once_fit_the_head_group():
    """The judge fleet's head, a build's and a nightly refresh's (whose cluster starts even when
    the build's lease turns it away) at the same time."""
    heads = {w.split("#")[0]: p for w, p in _all_pods() if w.endswith(":head")}
    at_once = [
        heads["judges/judges-rayservice.yaml"],
        heads["jobs/build-rayjob.yaml"],
        heads["k8s/20-refresh-rayjob-configmap.yaml"],
    ]
    (group,) = {g.name: g for p in at_once for g in capacity.matching_groups(p, GROUPS)}.values()
    assert capacity.nodes_for(at_once, group) <= group.max_size
    # the check can fail: twice as many heads as the group holds
    assert capacity.nodes_for(at_once * 2, group) > group.max_size


# --- quotas ----------------------------------------------------------------------------------


def test_the_quota_command_prints_what_the_readme_shows():
    out = io.StringIO()
    with redirect_stdout(out):
        assert capacity.main(["quotas"]) == 0
    lines = out.getvalue().splitlines()
    readme = (INFRA / "README.md").read_text()
    for line in lines:
        assert line in readme, line
    by_code = {line.split()[0]: int(line.split()[1]) for line in lines}
    # the G family on demand: the fleet's 6 g6e.12xlarge (48 vCPUs) and 8 g5.2xlarge (8)
    assert by_code["L-DB2E81BA"] == 6 * 48 + 8 * 8
    assert by_code["L-34B43A08"] == 32 * 16  # the spot CPU workers
    assert capacity.main(["nonsense"]) == 2
