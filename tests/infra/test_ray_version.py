"""One Ray version everywhere: pyproject.toml's pin is the one place naming it; the images' base
(infra/image/Dockerfile), the locks, the KubeRay manifests' rayVersion, the judge fleet's image,
the submitting host's job CLI and the docs say the same. Ray refuses a client or node of another
version, and KubeRay picks features by rayVersion, so one stale mention breaks a start."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

# every way a file names a Ray version: an image tag of Ray's, rayVersion, a pin or a Dockerfile
# ARG, a "Ray 2.NN" in prose
MENTIONS = [
    re.compile(r"rayproject/ray(?:-llm|-ml)?:(\d+\.\d+(?:\.\d+)?)"),
    re.compile(r"rayVersion:\s*[\"']?(\d+\.\d+\.\d+)"),
    re.compile(r"\bray(?:\[[\w,]+\])?==(\d+\.\d+(?:\.\d+)?)"),
    re.compile(r"ARG RAY_VERSION=(\d+\.\d+\.\d+)"),
    re.compile(r"\bRay (\d+\.\d+(?:\.\d+)?)\b"),
]


def pinned() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (ray,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "ray"]
    (spec,) = ray.specifier
    assert spec.operator == "==", f"pin Ray exactly, not {spec}"
    return spec.version


def mentions(text: str) -> set[str]:
    return {m.group(1) for pattern in MENTIONS for m in pattern.finditer(text)}


def _files() -> list[Path]:
    infra = [p for p in (ROOT / "infra").rglob("*") if p.is_file() and p.suffix != ".json"]
    docs = sorted((ROOT / "docs").glob("*.md"))  # the README's rest
    return [ROOT / "cluster.yaml", ROOT / "README.md", *docs, *sorted(infra)]


def test_every_file_names_the_pinned_ray():
    version = pinned()
    found = {str(p.relative_to(ROOT)): mentions(p.read_text()) for p in _files()}
    named = {f: m for f, m in found.items() if m}
    # the files that must name it do
    infra = [
        "image/Dockerfile",
        "image/cpu.lock",
        "image/gpu.lock",
        "judges/judges-rayservice.yaml",
        "k8s/20-refresh-rayjob-configmap.yaml",
        "k8s-raycronjob/refresh-raycronjob.yaml",
    ]
    for must in infra:
        assert f"infra/{must}" in named, must
    minor = version.rsplit(".", 1)[0]
    wrong = {f: m - {version, minor} for f, m in named.items() if m - {version, minor}}
    assert wrong == {}, f"Ray is pinned at {version} in pyproject.toml"


def test_the_version_check_can_fail():
    assert mentions("image: rayproject/ray-llm:2.59.0-py312-cu130") == {"2.59.0"}
    assert mentions('rayVersion: "2.58.1"\nARG RAY_VERSION=2.57.0') == {"2.58.1", "2.57.0"}
    assert mentions('pip install "ray[default]==2.55.0"; any Ray 2.54 cluster') == {
        "2.55.0",
        "2.54",
    }
