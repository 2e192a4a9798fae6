"""What the EKS deployment (infra/) asks of its node groups, and whether each ask can start a node
from zero, judged by the autoscalers' own rules rather than ours:

- Ray's: for a KubeRay worker group with no pods, Ray's KubeRay autoscaler knows only what the
  group spec advertises (rayStartParams, the Ray container's limits). `advertised_node_types`
  runs Ray's own conversion (ray.autoscaler._private.kuberay.autoscaling_config) and
  `unplaceable` Ray's own scale-up decision (resource_demand_scheduler.get_nodes_for, with
  placement groups combined as the autoscaler combines them).
- The Cluster Autoscaler's: for an empty Auto Scaling group it imagines a node from the instance
  type and the group's `k8s.io/cluster-autoscaler/node-template/...` tags (infra/eks/).
  `template_node` builds that node from infra/eks/nodegroups.yaml, and `misfits` says why a pod
  would not fit it.

Also the EC2 vCPU quotas the node groups need at their largest (`quotas`), printed by
`python -m cpr_ray.capacity quotas` from a checkout (infra/README.md, "Service quotas").
Run from a checkout: infra/ is not part of the wheel."""

from __future__ import annotations

import functools
import json
import math
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
NODEGROUPS = ROOT / "infra" / "eks" / "nodegroups.yaml"
TEMPLATE_TAG = "k8s.io/cluster-autoscaler/node-template/"
HEAD_GROUP = "headgroup"  # the name Ray's KubeRay autoscaler gives the head's node type


@dataclass(frozen=True)
class Instance:
    vcpus: int
    memory_gib: float
    gpus: int
    max_pods: int  # EKS's ENI-based default (amazon-eks-ami eni-max-pods.txt)
    family: (
        str  # the EC2 vCPU quota it counts against: "standard" (A, C, D, H, I, M, R, T, Z) or "G"
    )


INSTANCES: dict[str, Instance] = {
    "m6i.2xlarge": Instance(8, 32, 0, 58, "standard"),
    "m6i.4xlarge": Instance(16, 64, 0, 234, "standard"),
    "m6a.4xlarge": Instance(16, 64, 0, 234, "standard"),
    "m5.4xlarge": Instance(16, 64, 0, 234, "standard"),
    "g5.2xlarge": Instance(8, 32, 1, 58, "G"),
    "g6e.12xlarge": Instance(48, 384, 4, 234, "G"),
}

# The Service Quotas codes of the EC2 vCPU limits, by (family, spot)
_STANDARD = "Standard (A, C, D, H, I, M, R, T, Z)"
QUOTAS: dict[tuple[str, bool], tuple[str, str]] = {
    ("standard", False): ("L-1216C47A", f"Running On-Demand {_STANDARD} instances"),
    ("G", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("standard", True): ("L-34B43A08", f"All {_STANDARD} Spot Instance Requests"),
    ("G", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}

# What a node keeps from its pods beyond the kubelet's reservations: the DaemonSets of an EKS node
# (aws-node, kube-proxy, the NVIDIA device plugin on GPU nodes). An allowance, not a measurement.
DAEMONSETS = {"cpu": 0.3, "memory_gib": 0.5}


# --- Kubernetes quantities -------------------------------------------------------------------

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9,
           "T": 1e12, "m": 1e-3}  # fmt: skip


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity ("6", "500m", "24Gi", "300G") as a number (bytes for memory)."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    if not match or (match.group(2) and match.group(2) not in _SUFFIX):
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return float(match.group(1)) * _SUFFIX.get(match.group(2), 1)


# --- Ray's view: KubeRay group specs and what Ray asks for -----------------------------------


def advertised_node_types(cluster_spec: Mapping[str, Any]) -> dict[str, dict]:
    """The node types Ray's KubeRay autoscaler derives from a RayCluster spec (a RayJob's
    rayClusterSpec, a RayService's rayClusterConfig): each group's resources as advertised
    before any pod of it exists, and its min/max workers."""
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    cr = {"metadata": {"name": "cpr", "namespace": "cpr-ray"}, "spec": dict(cluster_spec)}
    return _derive_autoscaling_config_from_ray_cr(cr)["available_node_types"]


def serve_llm_placement(llm_config: Mapping[str, Any]) -> tuple[list[dict[str, float]], str]:
    """The placement group a Ray Serve LLM replica asks for (bundles, strategy), as Ray Serve LLM
    builds it for vLLM (ray.llm's VLLMEngineConfig.placement_bundles and
    LLMServer.get_deployment_options, which need vLLM to import, so restated here): one
    `bundle_per_worker` per GPU worker (tensor × pipeline parallel), each with a sliver of the
    accelerator-type resource, and the replica actor's own resources added to the first."""
    from ray.llm._internal.serve.core.configs.accelerators import format_ray_accelerator_resource

    engine = llm_config.get("engine_kwargs", {})
    workers = engine.get("tensor_parallel_size", 1) * engine.get("pipeline_parallel_size", 1)
    pg = llm_config.get("placement_group_config") or {}
    per_worker = pg.get("bundle_per_worker", {"GPU": 1})
    bundles = []
    for _ in range(workers):
        bundle = {k: float(v) for k, v in per_worker.items()}
        if llm_config.get("accelerator_type"):
            key = format_ray_accelerator_resource(llm_config["accelerator_type"])
            bundle.setdefault(key, 0.001)
        bundles.append(bundle)
    actor = llm_config.get("deployment_config", {}).get("ray_actor_options", {})
    replica = {"CPU": actor.get("num_cpus", 1), "GPU": actor.get("num_gpus", 0),
               **actor.get("resources", {})}  # fmt: skip
    for key, amount in replica.items():
        if amount:
            bundles[0][key] = bundles[0].get(key, 0.0) + float(amount)
    return bundles, pg.get("strategy", "PACK")


def placement_demands(bundles: list[dict[str, float]], strategy: str) -> list[dict[str, float]]:
    """The resource demands Ray's autoscaler turns a pending placement group into (STRICT_PACK:
    one combined bundle; PACK, SPREAD: the bundles)."""
    from ray.autoscaler._private.resource_demand_scheduler import (
        placement_groups_to_resource_demands,
    )

    # protobuf's generated modules make their classes at import and ship no stubs
    from ray.core.generated.common_pb2 import (  # type: ignore[attr-defined]
        Bundle,
        PlacementStrategy,
    )
    from ray.core.generated.gcs_pb2 import PlacementGroupTableData  # type: ignore[attr-defined]

    pg = PlacementGroupTableData(
        strategy=PlacementStrategy.Value(strategy),
        bundles=[Bundle(unit_resources=b) for b in bundles],
    )
    demands, strict_spread = placement_groups_to_resource_demands([pg])
    # Ray types amounts as numbers.Real, which mypy does not take a float for, nor the reverse
    every = [*demands, *(b for group in strict_spread for b in group)]
    return [{k: float(v) for k, v in d.items()} for d in every]


def unplaceable(
    node_types: Mapping[str, dict], demands: Iterable[Mapping[str, float]]
) -> list[dict[str, float]]:
    """The demands Ray's autoscaler would find no node type for, starting from no workers: its
    own scale-up decision (get_nodes_for), each demand on its own."""
    from ray.autoscaler._private.node_provider_availability_tracker import (
        NodeAvailabilitySummary,
    )
    from ray.autoscaler._private.resource_demand_scheduler import (
        _default_utilization_scorer,
        get_nodes_for,
    )

    scorer = functools.partial(
        _default_utilization_scorer,
        node_availability_summary=NodeAvailabilitySummary(node_availabilities={}),
    )
    left: list[dict[str, float]] = []
    for demand in demands:
        asked: dict[str, Any] = dict(demand)  # Ray's numbers.Real, which a float is at run time
        _, residual = get_nodes_for(dict(node_types), {}, HEAD_GROUP, 1000, [asked], scorer)
        left += [{k: float(v) for k, v in r.items()} for r in residual]
    return left


def advertised_custom(group: Mapping[str, Any]) -> dict[str, float]:
    """The custom resources a group's rayStartParams advertise (`resources`, a quoted JSON)."""
    text = group.get("rayStartParams", {}).get("resources")
    return json.loads(shlex.split(text)[0]) if text else {}


# --- the Cluster Autoscaler's view: node groups and their template nodes ---------------------


@dataclass(frozen=True)
class NodeGroup:
    name: str
    instance_types: tuple[str, ...]
    min_size: int
    max_size: int
    spot: bool
    volume_gib: int
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    tags: Mapping[str, str]
    propagate_tags: bool


def node_groups(path: Path = NODEGROUPS) -> list[NodeGroup]:
    """The managed node groups of an eksctl config."""
    config = yaml.safe_load(path.read_text())
    groups = []
    for g in config["managedNodeGroups"]:
        types = tuple(g.get("instanceTypes") or [g["instanceType"]])
        groups.append(
            NodeGroup(
                name=g["name"],
                instance_types=types,
                min_size=g.get("minSize", 0),
                max_size=g["maxSize"],
                spot=bool(g.get("spot", False)),
                volume_gib=g.get("volumeSize", 80),  # eksctl's default root volume
                labels=g.get("labels", {}),
                taints=tuple(g.get("taints", [])),
                tags=g.get("tags", {}),
                propagate_tags=bool(g.get("propagateASGTags", False)),
            )
        )
    return groups


@dataclass(frozen=True)
class TemplateNode:
    """The node the Cluster Autoscaler imagines for an empty group: what the scheduler may place
    on it (allocatable, DaemonSets taken off), its labels and its taints."""

    cpu: float
    memory: float  # bytes
    gpus: float
    ephemeral_storage: float  # bytes; 0 when no tag says
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]


def _kubelet_reserved_cpu(vcpus: int) -> float:
    """kube-reserved CPU on the EKS AMI: 6% of the first core, 1% of the second, 0.5% of the
    next two, 0.25% of the rest (amazon-eks-ami's bootstrap)."""
    steps = [(1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025)]
    reserved, left = 0.0, float(vcpus)
    for cores, share in steps:
        used = min(left, cores)
        reserved += used * share
        left -= used
    return reserved


def template_node(group: NodeGroup) -> TemplateNode:
    """The Cluster Autoscaler's template node of `group` (its smallest instance type): capacity
    from the instance type less the EKS AMI's kubelet reservations (CPU as above; memory 255 MiB
    + 11 MiB a pod, and the 100 MiB eviction threshold) and the DaemonSets; GPUs and ephemeral
    storage only from the group's node-template tags; labels and taints from the tags, or from
    the group's own when propagateASGTags copies them there, plus the well-known labels the
    autoscaler sets from the instance type."""
    instance = min((INSTANCES[t] for t in group.instance_types), key=lambda i: i.vcpus)
    mem_reserved = (255 + 11 * instance.max_pods + 100) * 2**20
    resources = {
        key[len(TEMPLATE_TAG + "resources/") :]: value
        for key, value in group.tags.items()
        if key.startswith(TEMPLATE_TAG + "resources/")
    }
    labels = {
        key[len(TEMPLATE_TAG + "label/") :]: value
        for key, value in group.tags.items()
        if key.startswith(TEMPLATE_TAG + "label/")
    }
    taints = list(group.taints) if group.propagate_tags else []
    if group.propagate_tags:
        labels = {**group.labels, **labels}
    if len(group.instance_types) == 1:
        labels["node.kubernetes.io/instance-type"] = group.instance_types[0]
    return TemplateNode(
        cpu=instance.vcpus - _kubelet_reserved_cpu(instance.vcpus) - DAEMONSETS["cpu"],
        memory=instance.memory_gib * 2**30 - mem_reserved - DAEMONSETS["memory_gib"] * 2**30,
        gpus=quantity(resources.get("nvidia.com/gpu", 0)),
        ephemeral_storage=quantity(resources.get("ephemeral-storage", 0)),
        labels=labels,
        taints=tuple(taints),
    )


def kubelet_ephemeral_storage(group: NodeGroup) -> float:
    """The ephemeral storage a started node offers pods: the root volume less the kubelet's 10%
    eviction threshold (nodefs.available) and 1 GiB kube-reserved."""
    return group.volume_gib * 2**30 * 0.9 - 2**30


def tolerated(taint: Mapping[str, str], tolerations: Iterable[Mapping[str, str]]) -> bool:
    for t in tolerations:
        if t.get("key") != taint["key"] or t.get("effect", taint["effect"]) != taint["effect"]:
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value") == taint.get("value"):
            return True
    return False


def requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """A pod's requests summed over its containers (a limit stands for a missing request, as the
    API server defaults it)."""
    total: dict[str, float] = {}
    for container in pod["containers"]:
        res = container.get("resources", {})
        asked = {**res.get("limits", {}), **res.get("requests", {})}
        for key, value in asked.items():
            total[key] = total.get(key, 0.0) + quantity(value)
    return total


def matching_groups(pod: Mapping[str, Any], groups: Iterable[NodeGroup]) -> list[NodeGroup]:
    """The groups whose nodes carry every label the pod's nodeSelector names."""
    selector = pod.get("nodeSelector", {})
    out = []
    for group in groups:
        labels = dict(group.labels)
        labels.update(template_node(group).labels)
        if group.spot:
            labels.setdefault("eks.amazonaws.com/capacityType", "SPOT")  # on a started node
        if all(labels.get(k) == v for k, v in selector.items()):
            out.append(group)
    return out


def misfits(pod: Mapping[str, Any], group: NodeGroup) -> list[str]:
    """Why the Cluster Autoscaler would not scale `group` up from zero for `pod` (empty: it
    would): a nodeSelector label or taint the template lacks, or a request above it."""
    node = template_node(group)
    why = [
        f"nodeSelector {k}={v} not on the template (tag {TEMPLATE_TAG}label/{k})"
        for k, v in pod.get("nodeSelector", {}).items()
        if node.labels.get(k) != v
    ]
    why += [
        f"taint {t['key']} not tolerated"
        for t in node.taints
        if not tolerated(t, pod.get("tolerations", []))
    ]
    offered = {
        "cpu": node.cpu,
        "memory": node.memory,
        "nvidia.com/gpu": node.gpus,
        "ephemeral-storage": node.ephemeral_storage,
    }
    for key, amount in requests(pod).items():
        if amount > offered.get(key, 0.0):
            why.append(f"{key} {amount:g} > the template's {offered.get(key, 0.0):g}")
    return why


def nodes_for(pods: Iterable[Mapping[str, Any]], group: NodeGroup) -> int:
    """Nodes of `group` that `pods` need at once, packed first-fit by CPU and memory."""
    node = template_node(group)
    free: list[list[float]] = []
    for pod in pods:
        asked = requests(pod)
        need = (asked.get("cpu", 0.0), asked.get("memory", 0.0))
        for slot in free:
            if need[0] <= slot[0] and need[1] <= slot[1]:
                slot[0] -= need[0]
                slot[1] -= need[1]
                break
        else:
            free.append([node.cpu - need[0], node.memory - need[1]])
    return len(free)


# --- EC2 vCPU quotas -------------------------------------------------------------------------


def quotas(groups: Iterable[NodeGroup]) -> dict[tuple[str, bool], list[tuple[str, int]]]:
    """(family, spot) -> [(group, vCPUs at its maxSize)]: every group at its largest, on its
    largest instance type."""
    need: dict[tuple[str, bool], list[tuple[str, int]]] = {}
    for group in groups:
        largest = max((INSTANCES[t] for t in group.instance_types), key=lambda i: i.vcpus)
        key = (largest.family, group.spot)
        need.setdefault(key, []).append((group.name, group.max_size * largest.vcpus))
    return need


def quota_lines(groups: Iterable[NodeGroup]) -> list[str]:
    """What `python -m cpr_ray.capacity quotas` prints: one line per EC2 vCPU quota."""
    lines = []
    for (family, spot), parts in sorted(quotas(groups).items(), key=lambda kv: QUOTAS[kv[0]]):
        code, name = QUOTAS[(family, spot)]
        total = sum(v for _, v in parts)
        by = ", ".join(f"{g} {v}" for g, v in parts)
        lines.append(f"{code}  {total:>4} vCPUs  {name} ({by})")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["quotas"] or len(argv) > 2:
        print("usage: python -m cpr_ray.capacity quotas [NODEGROUPS.yaml]", file=sys.stderr)
        return 2
    path = Path(argv[1]) if len(argv) == 2 else NODEGROUPS
    for line in quota_lines(node_groups(path)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
