"""The images start from Ray's, which already holds older versions of packages this one uses
(boto3 1.29, botocore 1.32, numpy 1.26, urllib3 1.26 ...: tests/data/ray-image/, Ray's own lock of
its base images). This reproduces that starting point without Docker: a venv seeded with the base
image's versions of the packages the locks share with it, then infra/image/install.sh's resolution
as the Dockerfile runs it (`--dry-run`), which must end at infra/image/cpu.lock; and the
conditional-write test (tests/storage/test_leases.py) under the base image's boto3/botocore, which
refuse the parameters the root's lease needs.

The locks themselves: each satisfies pyproject.toml, holds exactly one faiss build (faiss-cpu in
the CPU lock, faiss's CUDA build in the GPU lock) and the floors pyproject.toml sets.

The seeding needs the old wheels: from uv's cache offline, else from PyPI; skipped with the
reason when neither has them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "infra" / "image"
BASE_DEPS = Path(__file__).parents[1] / "data" / "ray-image" / "ray-base-deps-py3.11.txt"
UV = [sys.executable, "-m", "uv"]


def pins(path: Path) -> dict[str, str]:
    """name -> version of a requirements file of `name==version` lines (markers ignored)."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(*extras: str) -> list[Requirement]:
    project = _pyproject()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


# --- the locks -------------------------------------------------------------------------------


@pytest.mark.parametrize("target, extras", [("cpu", ("cpu", "dev")), ("gpu", ("gpu",))])
def test_each_lock_satisfies_pyproject_and_holds_one_faiss_build(target, extras):
    lock = pins(IMAGE / f"{target}.lock")
    unmet = [
        f"{req.name}{req.specifier} (lock: {lock.get(canonicalize_name(req.name))})"
        for req in _requirements(*extras)
        if req.marker is None or req.marker.evaluate({"extra": ""})
        if canonicalize_name(req.name) not in lock
        or not req.specifier.contains(lock[canonicalize_name(req.name)].split("+")[0], True)
    ]
    assert unmet == [], f"{target}.lock is stale: run `bash infra/image/lock.sh`"
    faiss = sorted(name for name in lock if name.startswith("faiss"))
    assert faiss == (["faiss-cpu"] if target == "cpu" else ["faiss-gpu"])
    if target == "gpu":
        # faiss-gpu is the CUDA 12 build: its runtime wheels are the -cu12 ones, the CUDA of the
        # GPU image's base (Dockerfile: `-cu128`)
        assert "nvidia-cuda-runtime-cu12" in lock
        assert re.search(r"^FROM \$\{RAY_IMAGE\}-cu12\d AS gpu$",
                         (IMAGE / "Dockerfile").read_text(), re.M)  # fmt: skip


def test_the_floors_cover_the_conditional_writes():
    """botocore before 1.35.69 has no IfNoneMatch/IfMatch on PutObject and DeleteObject."""
    reqs = {canonicalize_name(r.name): r for r in _requirements()}
    for name in ("boto3", "botocore"):
        assert not reqs[name].specifier.contains("1.35.68")
        assert reqs[name].specifier.contains("1.35.69")
    lock = pins(IMAGE / "cpu.lock")
    assert lock["botocore"] == __import__("botocore").__version__  # CI runs the locked version


# --- an image's starting point ---------------------------------------------------------------


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=240, **kwargs)


def _seed(target: Path, packages: dict[str, str], *, venv: bool) -> None:
    """Install `packages` at their versions (no dependencies) into a new venv or a folder, from
    uv's cache, else PyPI; skip the test when neither has them."""
    if venv:
        made = _run([*UV, "venv", "-q", "--seed", "--python", sys.executable, str(target)])
        assert made.returncode == 0, made.stderr
        where = ["--python", str(target / "bin" / "python")]
    else:
        where = ["--target", str(target)]
    specs = [f"{name}=={version}" for name, version in sorted(packages.items())]
    base = [*UV, "pip", "install", "-q", "--no-deps", *where, *specs]
    done = _run([*base, "--offline"])
    if done.returncode != 0:
        done = _run([*base, "--index-url", "https://pypi.org/simple"])
    if done.returncode != 0:
        pytest.skip(f"the base image's wheels are neither in uv's cache nor on PyPI: {done.stderr}")


@pytest.fixture(scope="module")
def starting_point(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A venv holding what Ray's image holds of the packages the locks share with it, and the uv
    install.sh would put there first (this one's)."""
    base = pins(BASE_DEPS)
    locked = pins(IMAGE / "cpu.lock") | pins(IMAGE / "gpu.lock")
    shared = {name: version for name, version in base.items() if name in locked}
    assert {"boto3", "botocore", "numpy", "fsspec", "urllib3"} <= set(shared)
    venv = tmp_path_factory.mktemp("ray-image") / "venv"
    _seed(venv, {**shared, "uv": version("uv")}, venv=True)
    return venv, shared


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_the_image_install_moves_the_base_images_packages_to_the_lock(starting_point, target):
    venv, shared = starting_point
    lock = pins(IMAGE / f"{target}.lock")
    # as the Dockerfile's target runs it, on the package's source instead of its wheel (torch
    # from this machine's sources: the CPU build here, whose version is the lock's all the same)
    argv = ["bash", str(IMAGE / "install.sh"), str(venv / "bin" / "python"), "--dry-run",
            "--lock", target, f"{ROOT}[{target}]"]  # fmt: skip
    plan = _run(argv, env={**os.environ, "UV_OFFLINE": "1"})  # uv's cache, when it holds all
    if plan.returncode != 0:
        plan = _run(argv)
    if plan.returncode != 0 and re.search(
        r"dns error|Failed to fetch|Could not connect", plan.stderr
    ):
        pytest.skip(f"PyPI is unreachable: {plan.stderr.strip().splitlines()[-1]}")
    assert plan.returncode == 0, plan.stderr
    planned = dict(re.findall(r"^ \+ ([\w.\-]+)==(\S+)", plan.stderr, re.M))
    planned = {canonicalize_name(n): v for n, v in planned.items()}
    # every package it installs or upgrades is the lock's version (torch: its build's label)
    off_lock = {n: v for n, v in planned.items() if n != "cpr-ray" and v.split("+")[0] != lock[n]}
    assert off_lock == {}
    # and nothing of the base image stays behind at its own version where the lock differs:
    # what the image needs of them (the GPU lock has no dev extra, and its core is the CPU
    # image's) and did not plan must already be at the lock's version
    runtime = pins(IMAGE / "gpu.lock")
    kept = {n: v for n, v in shared.items() if n not in planned and n in runtime}
    stale = {n: (v, lock[n]) for n, v in kept.items() if v != lock[n]}
    assert stale == {}, "the image would keep the base image's versions"
    assert Version(planned["botocore"]) >= Version("1.35.69")
    # one faiss build in the image
    faiss = sorted(n for n in planned if n.startswith("faiss"))
    assert faiss == (["faiss-cpu"] if target == "cpu" else ["faiss-gpu"])


WRITE_IF = """
import sys
from cpr_ray.storage.store import Storage, StorageConfig
st = Storage(StorageConfig(root=f"s3://{sys.argv[2]}/root", s3_endpoint=sys.argv[1]))
uri = st.root + "/_leases/owner.json"
first = st.write_if(uri, b"one")
second, third = st.write_if(uri, b"two"), st.write_if(uri, b"3", tag=first)
print(first is not None, second is None, third is not None)
"""


def test_the_base_images_botocore_refuses_the_leases_conditional_write(
    tmp_path, s3_endpoint, s3_bucket
):
    """The root lease's conditional write (Storage.write_if, as tests/storage/test_leases.py runs it
    with the lock's botocore, which this venv holds) on the S3 stand-in, with the base image's
    boto3/botocore first on sys.path: what every build and refresh would meet on an image that kept
    them."""
    base = pins(BASE_DEPS)
    old = {n: base[n] for n in ("boto3", "botocore", "s3transfer", "urllib3", "jmespath")}
    _seed(tmp_path / "old", old, venv=False)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "old")}
    code = "import botocore; print(botocore.__version__)\n" + WRITE_IF
    ran = _run([sys.executable, "-c", code, s3_endpoint, s3_bucket], env=env, cwd=ROOT)
    assert ran.stdout.splitlines()[0] == base["botocore"]
    # botocore refuses the parameter before sending anything (storage.py keeps the first line)
    assert ran.returncode == 1 and "Parameter validation failed" in ran.stderr, ran.stderr
    assert __import__("botocore").__version__ == pins(IMAGE / "cpu.lock")["botocore"]


# --- a GPU search actor on a CPU faiss -------------------------------------------------------


def test_a_search_actor_that_asked_for_a_gpu_refuses_a_faiss_that_sees_none():
    """This venv's faiss is the CPU build (the cpu lock): a dense pooler's search actor placed
    with a GPU stops before loading anything, in one line naming the image to run."""
    from cpr_ray.config import load_config
    from cpr_ray.pooling.poolers import PoolerSearch, plans
    from cpr_ray.storage.store import StorageConfig

    (dense, *_) = [p for p in plans(load_config("cluster", env={}).pooling) if p.kind == "dense"]
    assert dense.pool.gpus_per_actor > 0  # the cluster profile's dense poolers search on their GPU
    with pytest.raises(ValueError) as refused:
        PoolerSearch(dense, StorageConfig(root="/nonexistent"), "/nonexistent/docs", None)
    (line,) = str(refused.value).splitlines()
    assert "sees no GPU" in line and "--target gpu" in line and "cpr-ray[gpu]" in line
