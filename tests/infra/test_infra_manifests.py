"""infra/ offline: every Kubernetes manifest parses and validates against its schema, and the
deployment keeps the properties infra/README.md promises.

Built-in kinds go through kubernetes-validate (strict: unknown keys fail) for one Kubernetes
version. The KubeRay kinds (RayJob, also the one embedded in the ConfigMap, RayCronJob and the
judge fleet's RayService) go through jsonschema against the openAPIV3Schema of KubeRay's CRDs
vendored in tests/data/kuberay/ (see its PROVENANCE files), with `additionalProperties: false`
added to every object schema that lists its properties, as the API server's strict field
validation would; CEL rules and some enums stay unchecked.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import ray
import yaml

from cpr_ray.storage.leases import JOB_ENV
from tests.infra.test_cluster_config import IMAGE, find_credentials

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
KUBERAY_CRDS = Path(__file__).resolve().parents[1] / "data" / "kuberay"  # see its PROVENANCE files
KUBERAY_VERSION = "1.7.0"
K8S_VERSION = "1.35"  # kubernetes-validate 1.37.0 ships schemas for 1.25 to 1.37

NAMESPACE = "cpr-ray"
GPU_NODE_RESOURCE = "cpr_gpu_node"
BUCKET = "my-cpr-bucket"
READ_ONLY_PREFIXES = {"s2", "configs"}
READ_WRITE_PREFIXES = {"builds", "models", "eval", "index"}
OBJECT_WRITES = {
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
}
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


# --- loading ---------------------------------------------------------------------------------


def _load_manifests() -> list[tuple[str, dict]]:
    """(where, document) for every YAML document under infra/ (but serve/, Ray Serve's own
    format, checked by tests/search/test_search_service.py, and eks/, eksctl's config, checked by
    tests/infra/test_scale_from_zero.py), then every manifest embedded in a ConfigMap's data (a
    `*.yaml` key holding a Kubernetes object)."""
    found = []
    for path in sorted(INFRA.rglob("*.yaml")):
        if path.parent.name in ("serve", "eks"):
            continue
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                found.append((f"{path.relative_to(INFRA)}#{i}", doc))
    for where, doc in list(found):
        if doc.get("kind") == "ConfigMap":
            for key, text in (doc.get("data") or {}).items():
                inner = yaml.safe_load(text) if key.endswith((".yaml", ".yml")) else None
                if isinstance(inner, dict) and "apiVersion" in inner:
                    found.append((f"{where}:data.{key}", inner))
    return found


MANIFESTS = _load_manifests()
BUILTIN = [(w, d) for w, d in MANIFESTS if not d["apiVersion"].startswith("ray.io/")]
KUBERAY = [(w, d) for w, d in MANIFESTS if d["apiVersion"].startswith("ray.io/")]
# the Ray clusters that run this package's jobs (the refresh RayJob and its RayCronJob)
KUBERAY_JOBS = [(w, d) for w, d in KUBERAY if d["kind"] in ("RayJob", "RayCronJob")]


def _only(kind: str, where_part: str = "") -> dict:
    docs = [d for w, d in MANIFESTS if d["kind"] == kind and where_part in w]
    assert len(docs) == 1, f"expected one {kind} ({where_part}), found {len(docs)}"
    return docs[0]


def _by_name(kind: str, name: str) -> dict:
    docs = [d for _, d in MANIFESTS if d["kind"] == kind and d["metadata"].get("name") == name]
    assert len(docs) == 1, f"no single {kind}/{name} in infra/"
    return docs[0]


def _refresh_rayjob() -> dict:
    return _only("RayJob", ":data.")  # the one the CronJob creates


def _pod_specs(job_spec: dict) -> dict[str, dict]:
    """Pod spec of the head and of each worker group of a RayJob (or RayService) spec, by
    group name."""
    cluster = job_spec.get("rayClusterSpec") or job_spec["rayClusterConfig"]
    pods = {"head": cluster["headGroupSpec"]["template"]["spec"]}
    for group in cluster["workerGroupSpecs"]:
        pods[group["groupName"]] = group["template"]["spec"]
    return pods


def _close_objects(schema):
    """The schema with `additionalProperties: false` on every object schema that lists
    `properties` and says nothing about others (walks only the schema keywords)."""
    if isinstance(schema, list):
        return [_close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {}
    for key, value in schema.items():
        if key == "properties":
            closed[key] = {name: _close_objects(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            closed[key] = _close_objects(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            closed[key] = [_close_objects(s) for s in value]
        else:
            closed[key] = value
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@pytest.fixture(scope="module")
def crd_validators() -> dict[str, jsonschema.Draft7Validator]:
    """kind -> validator for the ray.io/v1 schema of each KubeRay CRD (loaded once, ~1-3 s)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    validators = {}
    for path in sorted(KUBERAY_CRDS.glob(f"ray.io_*.v{KUBERAY_VERSION}.yaml.gz")):
        with gzip.open(path, "rt") as f:
            crd = yaml.load(f, Loader=loader)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = _close_objects(version["schema"]["openAPIV3Schema"])
        validators[crd["spec"]["names"]["kind"]] = jsonschema.Draft7Validator(schema)
    assert {"RayJob", "RayCronJob", "RayService"} <= set(validators), sorted(validators)
    return validators


def _crd_errors(validators, doc: dict) -> list[str]:
    errors = validators[doc["kind"]].iter_errors(doc)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


# --- schemas ---------------------------------------------------------------------------------


def test_the_expected_manifests_are_there():
    kinds = {d["kind"] for _, d in MANIFESTS}
    expected = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "CronJob"}
    assert expected | {"Ingress", "RayJob", "RayCronJob", "RayService"} <= kinds


@pytest.mark.parametrize("where, doc", BUILTIN, ids=[w for w, _ in BUILTIN])
def test_builtin_kinds_validate_against_the_kubernetes_schema(where, doc):
    try:
        validated = kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:  # it would otherwise just warn
        pytest.fail(f"{where}: {exc.message}")
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert validated == K8S_VERSION


def test_the_kubernetes_validator_can_fail():
    cronjob = _by_name("CronJob", "cpr-refresh")
    typo = copy.deepcopy(cronjob)
    typo["spec"]["concurencyPolicy"] = typo["spec"].pop("concurrencyPolicy")
    with pytest.raises(kubernetes_validate.ValidationError, match="concurencyPolicy"):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    wrong_type = copy.deepcopy(cronjob)
    wrong_type["spec"]["startingDeadlineSeconds"] = "3600"
    with pytest.raises(kubernetes_validate.ValidationError, match="is not of type 'integer'"):
        kubernetes_validate.validate(wrong_type, K8S_VERSION, strict=True)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(_refresh_rayjob(), K8S_VERSION, strict=True)


@pytest.mark.parametrize("where, doc", KUBERAY, ids=[w for w, _ in KUBERAY])
def test_kuberay_kinds_validate_against_the_crds(where, doc, crd_validators):
    assert doc["apiVersion"] == "ray.io/v1"
    assert _crd_errors(crd_validators, doc) == []


# one mistake a hand-edited manifest makes, per row: (kind, path, change, a part of the error);
# a change renames the key (a typo), sets it (a wrong type, a key that does not exist) or deletes it
MISTAKES = [
    ("RayJob", "spec.shutdownAfterJobFinishes", ("rename", "shutdownAfterJobFinished"), "Finished"),
    ("RayJob", "spec.rayClusterSpec.workerGroupSpecs.0.maxReplica", ("set", 3), "maxReplica'"),
    ("RayJob", "spec.backoffLimit", ("set", "1"), "is not of type 'integer'"),
    ("RayCronJob", "spec.jobTemplate.rayClusterSpec.headGroupSpec.rayStartParams.x", ("set", 0),
     "is not of type 'string'"),
    ("RayCronJob", "spec.schedule", ("delete", None), "'schedule' is a required property"),
    ("RayService", "spec.serveConfigV2", ("rename", "serveConfig2"), "serveConfig2"),
    ("RayService", "spec.rayClusterConfig.workerGroupSpecs.0.maxReplica", ("set", 6),
     "maxReplica'"),
    ("RayService", "spec.rayClusterConfig.workerGroupSpecs.0.maxReplicas", ("set", "6"),
     "is not of type 'integer'"),
]  # fmt: skip


@pytest.mark.parametrize("kind, path, change, error", MISTAKES)
def test_the_crd_validators_catch_a_typo_a_wrong_type_and_a_missing_field(
    crd_validators, kind, path, change, error
):
    doc = copy.deepcopy(_refresh_rayjob() if kind == "RayJob" else _only(kind))
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    how, value = change
    if how == "rename":
        node[value] = node.pop(last)
    elif how == "set":
        node[last] = value
    else:
        del node[last]
    errors = _crd_errors(crd_validators, doc)
    assert any(error in e for e in errors), errors


# --- what the manifests do -------------------------------------------------------------------


def test_everything_lives_in_one_namespace():
    assert _only("Namespace")["metadata"]["name"] == NAMESPACE
    for where, doc in MANIFESTS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, where


def test_the_cronjob_creates_the_rayjob_from_the_configmap():
    cronjob = _by_name("CronJob", "cpr-refresh")
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    assert len(spec["schedule"].split()) == 5 and spec["timeZone"]

    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    # kubectl speaks to clusters one minor either side: the one the manifests are validated for
    kubectl = re.fullmatch(r"registry\.k8s\.io/kubectl:v1\.(\d+)\.\d+", container["image"])
    assert abs(int(kubectl.group(1)) - int(K8S_VERSION.split(".")[1])) <= 1
    argv = container.get("command", []) + container.get("args", [])
    assert argv[-3:-1] == ["create", "-f"]  # `apply` would need a fixed name
    manifest_path = Path(argv[-1])
    mounts = container["volumeMounts"]
    (mount,) = [m for m in mounts if manifest_path.is_relative_to(m["mountPath"])]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    configmap = _by_name("ConfigMap", volume["configMap"]["name"])
    key = str(manifest_path.relative_to(mount["mountPath"]))
    rayjob = yaml.safe_load(configmap["data"][key])
    assert rayjob == _refresh_rayjob()
    assert rayjob["metadata"]["generateName"] and "name" not in rayjob["metadata"]
    assert rayjob["metadata"]["namespace"] == cronjob["metadata"]["namespace"]


def test_the_launcher_may_create_rayjobs_and_nothing_else():
    cronjob = _by_name("CronJob", "cpr-refresh")
    account = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    sa = _by_name("ServiceAccount", account)
    assert "eks.amazonaws.com/role-arn" not in sa["metadata"].get("annotations", {})
    bindings = [
        d
        for _, d in MANIFESTS
        if d["kind"] == "RoleBinding"
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in d["subjects"])
    ]
    assert len(bindings) == 1
    role = _by_name("Role", bindings[0]["roleRef"]["name"])
    assert bindings[0]["roleRef"]["kind"] == "Role"
    assert role["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayjobs"],
            "verbs": ["create", "get", "list", "watch"],
        }
    ]


def test_the_rayjob_tears_its_cluster_down_and_is_bounded():
    spec = _refresh_rayjob()["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert 0 < spec["activeDeadlineSeconds"] < 24 * 3600  # done before the next night's run
    assert spec["backoffLimit"] >= 0
    assert spec.get("submissionMode", "K8sJobMode") == "K8sJobMode"


def test_the_ray_cluster_is_the_launcher_layout():
    cluster = _refresh_rayjob()["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"

    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    offers_gpu_resource = {}
    for name, group in groups.items():
        assert group["minReplicas"] == 0 == group.get("replicas", 0) < group["maxReplicas"]
        resources = group["rayStartParams"].get("resources")
        custom = json.loads(shlex.split(resources)[0]) if resources else {}
        offers_gpu_resource[name] = custom.get(GPU_NODE_RESOURCE, 0) > 0
    assert sorted(n for n, offers in offers_gpu_resource.items() if offers) == ["gpu"]

    cpu_pool = groups["cpu-spot"]["template"]["spec"]["nodeSelector"]
    assert cpu_pool["eks.amazonaws.com/capacityType"] == "SPOT"


def test_every_ray_pod_runs_the_image_of_its_kind_and_installs_nothing():
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    launcher_images = {launcher["docker"]["image"], launcher["docker"]["worker_image"]}
    for node in launcher["available_node_types"].values():
        launcher_images.add(node.get("docker", {}).get("worker_image"))
    for where, doc in KUBERAY_JOBS:
        spec = doc["spec"].get("jobTemplate", doc["spec"])
        for name, pod in _pod_specs(spec).items():
            (container,) = pod["containers"]
            match = IMAGE.fullmatch(container["image"])
            assert match, (where, name, container["image"])
            assert container["image"] in launcher_images  # the same images as the launcher's
            has_gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
            assert has_gpu == (name == "gpu") == (match.group(1) == "gpu"), (where, name)
            assert not {"command", "args", "lifecycle"} & set(container), (where, name)
        # the job's code, nothing installed: no pip, uv, conda, py_executable or image_uri
        runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
        assert set(runtime_env) == {"working_dir", "config"}, where


def test_credentials_come_from_the_secret_and_irsa():
    for where, doc in KUBERAY_JOBS:
        spec = doc["spec"].get("jobTemplate", doc["spec"])
        for group, pod in _pod_specs(spec).items():
            sa = _by_name("ServiceAccount", pod["serviceAccountName"])
            role_arn = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
            assert re.fullmatch(r"arn:aws:iam::ACCOUNT_ID:role/[\w+=,.@-]+", role_arn)
            for container in pod["containers"]:
                env = {e["name"]: e for e in container.get("env", [])}
                # S2's key only where the refresh's driver runs
                keys = {"S2_API_KEY", "OPENAI_API_KEY"} if group == "head" else {"OPENAI_API_KEY"}
                assert {n for n in env if SECRET_ENV.search(n)} == keys, (where, group)
                for name, var in env.items():
                    if SECRET_ENV.search(name):
                        assert "value" not in var, (where, group, name)
                        ref = var["valueFrom"]["secretKeyRef"]
                        assert ref == {"name": "cpr-refresh-secrets", "key": name}
    assert not [d for _, d in MANIFESTS if d["kind"] == "Secret"]  # made by hand, never stored
    for where, doc in MANIFESTS:  # no container anywhere gets a secret-looking literal
        for env in _env_lists(doc):
            literal = [e["name"] for e in env if SECRET_ENV.search(e["name"]) and "value" in e]
            assert literal == [], where


def _env_lists(node):
    if isinstance(node, dict):
        if isinstance(node.get("env"), list):
            yield node["env"]
        for value in node.values():
            yield from _env_lists(value)
    elif isinstance(node, list):
        for value in node:
            yield from _env_lists(value)


def test_the_raycronjob_runs_the_same_job():
    cron = _only("RayCronJob")
    assert len(cron["metadata"]["name"]) <= 36  # KubeRay names its RayJobs after it
    assert cron["spec"]["jobTemplate"] == _refresh_rayjob()["spec"]
    cronjob = _by_name("CronJob", "cpr-refresh")["spec"]
    assert (cron["spec"]["schedule"], cron["spec"]["timeZone"]) == (
        cronjob["schedule"],
        cronjob["timeZone"],
    )


def test_runtime_env_pins_one_commit():
    runtime_env = yaml.safe_load(_refresh_rayjob()["spec"]["runtimeEnvYAML"])
    archive = runtime_env["working_dir"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/archive/COMMIT_SHA\.zip", archive)
    assert runtime_env["config"]["setup_timeout_seconds"] >= 300
    # the images are the same commit's (the tag IMAGE requires)


def test_ray_token_authentication_on_every_ray_cluster():
    for where, doc in KUBERAY:
        spec = doc["spec"].get("jobTemplate", doc["spec"])
        cluster = spec.get("rayClusterSpec") or spec["rayClusterConfig"]  # RayJob / RayService
        # KubeRay sets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret on every Ray
        # container and its job submitter; the Secret is made by hand, never stored here
        assert cluster["authOptions"] == {"mode": "token", "secretName": "cpr-ray-auth"}, where
        head = cluster["headGroupSpec"]["rayStartParams"]
        assert head.get("dashboard-host", "0.0.0.0") == "0.0.0.0"  # reachable, so with a token
        for pod in _pod_specs(spec).values():
            (container,) = pod["containers"]
            names = {e["name"] for e in container.get("env", [])}
            assert not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} & names, where  # KubeRay's to set


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # Kubernetes' label on a Job's pods


def test_every_attempt_of_a_rayjob_runs_its_driver_with_the_rayjob_name_as_cpr_job_id(tmp_path):
    """A retried refresh or build takes over its killed attempt's lease at once only if both
    attempts' drivers see the same CPR_JOB_ID (cpr_ray/storage/leases.py). KubeRay re-creates
    the submitter Job under the RayJob's name for every attempt; its pod reads that name from
    its Job label, KubeRay's submit command (`ray job submit ... -- ENTRYPOINT`, in bash there)
    expands the entrypoint's $CPR_JOB_ID, and the head runs the entrypoint with a shell: both
    shells run here on the manifests' own entrypoints, with stand-ins for `ray` and `python`."""
    python = tmp_path / "python"  # the driver: says which CPR_JOB_ID it was started with
    python.write_text(f'#!/bin/sh\nprintf "%s" "${JOB_ENV}"\n')
    python.chmod(0o755)
    for where, doc in KUBERAY_JOBS:
        spec = doc["spec"].get("jobTemplate", doc["spec"])
        submitter = spec["submitterPodTemplate"]["spec"]
        assert submitter["restartPolicy"] == "Never", where
        (container,) = submitter["containers"]
        assert not {"command", "args"} & set(container), where  # KubeRay's own submit command
        head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        assert container["image"] == head["image"], where
        (env,) = [e for e in container["env"] if e["name"] == JOB_ENV]
        label = f"metadata.labels['{JOB_NAME_LABEL}']"
        assert env["valueFrom"] == {"fieldRef": {"fieldPath": label}}, where

        # the submitter pod: KubeRay's command line, a `ray` that hands on what follows `--`
        stand_in_ray = 'ray() { while [ "$1" != "--" ]; do shift; done; shift; printf "%s" "$*"; }'
        submit = f"{stand_in_ray}; ray job submit --address http://h:8265 -- {spec['entrypoint']} ;"
        pod_env = {"PATH": os.environ["PATH"], JOB_ENV: "cpr-refresh-x7k2p"}
        sent = subprocess.run(["bash", "-c", submit], env=pod_env, capture_output=True, text=True)
        assert sent.returncode == 0, sent.stderr
        # the head: Ray's job manager runs the entrypoint it was sent with a shell
        head_env = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
        driver = subprocess.run(["sh", "-c", sent.stdout], env=head_env, capture_output=True)
        assert driver.stdout.decode() == "cpr-refresh-x7k2p", (where, sent.stdout)


def _named_job_scripts() -> set[str]:
    texts = [doc["spec"].get("jobTemplate", doc["spec"])["entrypoint"] for _, doc in KUBERAY_JOBS]
    texts += [p.read_text() for p in (INFRA / "launcher").iterdir() if p.suffix != ".json"]
    return {m for text in texts for m in re.findall(r"\bjobs/[\w/-]+\.py\b", text)}


def test_entrypoints_name_existing_job_scripts():
    named = _named_job_scripts()
    assert "jobs/refresh.py" in named
    missing = sorted(script for script in named if not (ROOT / script).is_file())
    assert missing == []


# --- IAM -------------------------------------------------------------------------------------


def _statements(path: Path) -> list[dict]:
    policy = json.loads(path.read_text())
    assert policy["Version"] == "2012-10-17"
    statements = policy["Statement"]
    for st in statements:  # Action and Resource as lists from here on
        assert st["Effect"] == "Allow" and not {"NotAction", "NotResource"} & set(st), st
        for key in ("Action", "Resource"):
            if isinstance(st.get(key), str):
                st[key] = [st[key]]
        assert all("*" not in a for a in st["Action"]), st  # no "*", no s3:*, no s3:Get*
    return statements


def test_iam_policy_grants_exactly_the_job_prefixes():
    grants: dict[str, set[str]] = {}
    for st in _statements(INFRA / "iam-policy.json"):
        for resource in st["Resource"]:
            grants.setdefault(resource, set()).update(st["Action"])
            if resource == f"arn:aws:s3:::{BUCKET}":
                # listing the bucket, unconditioned: what S3 asks before it answers a missing
                # key with 404 rather than 403 (infra/README.md, "Layout shared by both")
                assert st["Action"] == ["s3:ListBucket"] and "Condition" not in st, st
    # nothing on the public OpenAlex bucket: the cluster profile reads it unsigned
    expected = {f"arn:aws:s3:::{BUCKET}": {"s3:ListBucket"}}
    expected.update({f"arn:aws:s3:::{BUCKET}/{p}/*": {"s3:GetObject"} for p in READ_ONLY_PREFIXES})
    expected.update(
        {
            f"arn:aws:s3:::{BUCKET}/{p}/*": {"s3:GetObject"} | OBJECT_WRITES
            for p in READ_WRITE_PREFIXES
        }
    )
    assert grants == expected


def test_every_bucket_path_the_deployment_names_is_granted():
    texts = [p.read_text() for p in INFRA.rglob("*") if p.is_file()]
    texts += [(ROOT / name).read_text() for name in ("cluster.yaml", "README.md")]
    texts += [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]  # the README's rest
    texts += [p.read_text() for p in (ROOT / "cpr_ray" / "profiles").glob("*.yaml")]
    uris = {m for text in texts for m in re.findall(rf"s3://{BUCKET}/([\w.-]+)/", text)}
    assert "configs" in uris
    assert uris <= READ_ONLY_PREFIXES | READ_WRITE_PREFIXES
    # the docs' examples name the one placeholder bucket, whose prefixes the policy knows
    others = {m for text in texts for m in re.findall(r"s3://([\w.-]+)/", text)}
    assert others <= {BUCKET, "openalex"}, others


def test_launcher_and_trust_policies_are_narrow():
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    worker_profiles = {
        node["node_config"]["IamInstanceProfile"]["Name"]
        for name, node in launcher["available_node_types"].items()
        if name != launcher["head_node_type"]
    }
    autoscaler = _statements(INFRA / "launcher" / "iam-policy-autoscaler.json")
    (pass_role,) = [st for st in autoscaler if "iam:PassRole" in st["Action"]]
    assert pass_role["Action"] == ["iam:PassRole"]
    assert {r.rsplit("/", 1)[1] for r in pass_role["Resource"]} == worker_profiles
    assert pass_role["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
    for st in autoscaler:
        if "ec2:TerminateInstances" in st["Action"]:
            tag = st["Condition"]["StringEquals"]["ec2:ResourceTag/ray-cluster-name"]
            assert tag == launcher["cluster_name"]
    # the SSM parameters each role's node-env.sh reads: tests/runs/test_node_env.py

    trust = json.loads((INFRA / "aws" / "irsa-trust-policy.json").read_text())
    (st,) = trust["Statement"]
    pods = _pod_specs(_refresh_rayjob()["spec"]).values()
    (account,) = {pod["serviceAccountName"] for pod in pods}  # one for all Ray pods
    subject = st["Condition"]["StringEquals"]["OIDC_PROVIDER:sub"]
    assert subject == f"system:serviceaccount:{NAMESPACE}:{account}"


# --- hygiene ---------------------------------------------------------------------------------


def test_no_credentials_in_infra():
    leaks = {
        str(p.relative_to(ROOT)): found
        for p in sorted(INFRA.rglob("*"))
        if p.is_file() and (found := find_credentials(p.read_text()))
    }
    assert leaks == {}


def test_readme_names_every_file_and_the_pinned_versions():
    readme = (INFRA / "README.md").read_text()
    for path in sorted(INFRA.rglob("*")):
        if path.is_file() and path.name != "README.md":
            assert str(path.relative_to(INFRA)) in readme, path
    assert f"--version {KUBERAY_VERSION}" in readme
    assert "kubectl -n cpr-ray create job --from=cronjob/cpr-refresh" in readme
    assert "--submission-id" in readme and "ray up cluster.yaml" in readme


def test_the_build_rayjob_is_the_refresh_cluster_with_a_deadline_from_the_sizing():
    """Day one's step 10 on path A: the refresh's RayJob running the build, whose deadline holds
    twice the judging's wall time at the fleet's most replicas (cpr_ray/judge_check/fleet.py,
    benchmarks/SCALE.md) and stays under two days."""
    from cpr_ray.config import load_config
    from cpr_ray.judge_check import fleet
    from tests.judge_check.test_judge_fleet import _llm_configs

    build = _by_name_prefix("RayJob", "cpr-build-")
    refresh = _refresh_rayjob()
    differs = {k for k in build["spec"] if build["spec"][k] != refresh["spec"].get(k)}
    assert differs == {"entrypoint", "activeDeadlineSeconds", "rayClusterSpec"}
    relabelled = yaml.safe_load(
        yaml.safe_dump(build["spec"]["rayClusterSpec"]).replace("cpr-build", "cpr-refresh")
    )
    assert relabelled == refresh["spec"]["rayClusterSpec"]
    assert re.match(
        r"(CPR_JOB_ID=\$CPR_JOB_ID )?python jobs/build_dataset\.py --config s3://",
        build["spec"]["entrypoint"],
    )

    cfg = load_config("cluster", env={})
    stage_models = {stage: cfg.llm.for_stage(stage)[0] for stage in fleet.FLEET_STAGES}
    gpus = {
        model: raw["engine_kwargs"]["tensor_parallel_size"]
        * raw["deployment_config"]["autoscaling_config"]["max_replicas"]
        for model, raw in _llm_configs().items()
    }
    judging_h = sum(s.wall_hours for s in fleet.build_load(stage_models, fleet.GPUS["L40S"], gpus))
    assert judging_h > 10  # ~13 h
    assert 2 * judging_h * 3600 <= build["spec"]["activeDeadlineSeconds"] <= 48 * 3600


def _by_name_prefix(kind: str, prefix: str) -> dict:
    (doc,) = [
        d
        for _, d in MANIFESTS
        if d["kind"] == kind and d["metadata"].get("generateName", "").startswith(prefix)
    ]
    return doc
