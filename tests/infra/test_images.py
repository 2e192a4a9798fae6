"""The cluster images (infra/image/Dockerfile) hold what `make install` installs: both go through
infra/image/install.sh, at a lock's versions (infra/image/cpu.lock, gpu.lock); the CPU target
takes torch's CPU build, the GPU target its CUDA build; nothing else installs anything, at build
time or when a node starts.

No Docker engine runs here, so the Dockerfile is read, not built: its instructions (continuation
lines joined, comments dropped) and its stages. `make -n` prints the Makefile's real recipe."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import ray
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = ROOT / "infra" / "image"
SCRIPT = "infra/image/install.sh"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# a Python package install (the Makefile's `browser` target installs Debian's chromium)
INSTALLS = re.compile(r"\b(pip|uv|conda|mamba)\b[^|;&]*\binstall\b")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines()))
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def _stages() -> dict[str, dict]:
    """stage name -> {"from": base, "run": [RUN arguments]}; ARG defaults substituted in FROM."""
    args, stages, current = {}, {}, None
    for keyword, rest in _instructions((IMAGE_DIR / "Dockerfile").read_text()):
        if keyword == "ARG" and current is None:
            name, _, default = rest.partition("=")
            args[name] = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], default)
        elif keyword == "FROM":
            base, _, name = rest.partition(" AS ")
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
            current = stages[name] = {"from": base, "run": [], "args": dict(args)}
        elif keyword == "RUN":
            current["run"].append(rest)
    return stages


def _installing_lines(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if INSTALLS.search(line) and not line.startswith("#")]


def _installer_calls(run: str) -> list[list[str]]:
    """The install.sh invocations in a RUN line, as argv after the script's path."""
    argv = shlex.split(run)
    return [argv[i + 1 :] for i, word in enumerate(argv) if word.endswith(SCRIPT)]


def test_the_makefile_installs_through_the_script():
    def recipe(*overrides: str) -> list[str]:
        out = subprocess.run(
            ["make", "-n", "-B", "-C", str(ROOT), "/tmp/cpr-venv/.installed", "VENV=/tmp/cpr-venv",
             *overrides],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        return [line for line in out.stdout.splitlines() if not line.startswith("make")]

    assert recipe() == [
        "python3 -m venv /tmp/cpr-venv",
        f"bash {SCRIPT} /tmp/cpr-venv/bin/python --lock cpu \\",
        "\t-e '.[cpu,dev]'",
        "touch /tmp/cpr-venv/.installed",
    ]
    with_index = f"bash {SCRIPT} /tmp/cpr-venv/bin/python --lock cpu --torch-index"
    with_index += f" {CPU_TORCH_INDEX}"
    assert f"{with_index} \\" in recipe(f"TORCH_INDEX={CPU_TORCH_INDEX}")
    assert _installing_lines(ROOT / "Makefile") == []


def test_the_script_installs_the_pinned_torch_under_the_lock():
    script = (IMAGE_DIR / "install.sh").read_text()
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.strip()]
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", pins[0]) and len(pins) == 1
    for target in ("cpu", "gpu"):  # the locks carry constraints.txt's pin (lock.sh compiles it)
        assert f"{pins[0]}\n" in (IMAGE_DIR / f"{target}.lock").read_text()
    installs = [line for line in script.splitlines() if INSTALLS.search(line)]
    # the tool itself; then uv, else pip, both with the target's lock, torch and the requirements
    assert installs[0].strip() == '"$py" -m pip install -q --upgrade uv'
    commands = re.split(r"\n|\|\|", script.replace("\\\n", " "))
    for tool in ('"$py" -m uv pip install', '"$py" -m pip install -q -c'):
        (command,) = [c for c in commands if tool in c]
        assert '-c "$lock"' in command
        assert '"${torch_index[@]}"' in command and 'torch "$@"' in command
    assert 'lock="$root/infra/image/$2.lock"' in script
    assert "--compile-bytecode" in script


def test_the_dockerfile_targets_install_through_the_script():
    stages = _stages()
    assert {"cpu", "gpu"} <= set(stages)
    for target in ("cpu", "gpu"):
        stage = stages[target]
        # Ray's image of the Ray this package pins, in the flavour of the target
        flavour = "cpu" if target == "cpu" else r"cu12\d"
        assert re.fullmatch(
            rf"rayproject/ray:{re.escape(ray.__version__)}-py3\d+-{flavour}", stage["from"]
        ), stage["from"]
        (run,) = stage["run"]
        (argv,) = _installer_calls(run)
        python, *rest = argv
        assert python == "python"  # the image's own Python, where Ray is
        assert rest[:2] == ["--lock", target]
        rest = rest[2:]
        if target == "cpu":
            assert rest[:2] == ["--torch-index", "${TORCH_CPU_INDEX}"]
            assert stage["args"]["TORCH_CPU_INDEX"] == CPU_TORCH_INDEX
            rest = rest[2:]
        # the package built in the wheel stage, with its target's extra (its faiss build)
        assert rest == [f"${{wheel}}[{target}]"]
        assert 'wheel="$(echo /tmp/wheels/cpr_ray-*.whl)"' in run
        assert "--mount=type=bind,target=/tmp/cpr-ray" in run  # the script and constraints.txt
        assert f"bash /tmp/cpr-ray/{SCRIPT}" in run
    assert len({stages[t]["from"].rsplit("-", 1)[0] for t in ("cpu", "gpu")}) == 1  # one Python
    # nothing else installs: the wheel stage only builds the package, without its dependencies
    (wheel_run,) = stages["wheel"]["run"]
    assert wheel_run.startswith("pip wheel --no-deps ")
    others = [r for s in stages.values() for r in s["run"] if INSTALLS.search(r)]
    assert others == []


def test_the_build_context_carries_what_the_build_reads():
    ignore = (IMAGE_DIR / "Dockerfile.dockerignore").read_text().split()
    kept = {line[1:] for line in ignore if line.startswith("!")}
    assert ignore[ignore.index("*") :].count("*") == 1 and "*" in ignore
    copied = {
        path
        for keyword, rest in _instructions((IMAGE_DIR / "Dockerfile").read_text())
        if keyword == "COPY"
        for path in shlex.split(rest)[:-1]
        if not path.startswith("--")
    }
    assert copied | {"constraints.txt", "infra/image"} == kept
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'readme = "README.md"' in pyproject  # why the build needs README.md


def test_no_runtime_env_or_start_command_installs_anything():
    """Where else an install could hide: the Ray Serve config's runtime_env and the launcher's
    commands (the KubeRay jobs' runtime_env: tests/infra/test_infra_manifests.py)."""
    serve = yaml.safe_load((ROOT / "infra" / "serve" / "search.yaml").read_text())
    envs = [serve.get("runtime_env") or {}] + [
        app.get("runtime_env") or {} for app in serve["applications"]
    ]
    assert all(not {"pip", "uv", "conda", "py_executable"} & set(env) for env in envs)
    assert _installing_lines(ROOT / "cluster.yaml") == []
