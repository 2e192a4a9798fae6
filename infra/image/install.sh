#!/usr/bin/env bash
# Installs this package and its dependencies into PYTHON's environment: the one install both
# `make install` (a virtualenv here and in CI) and the cluster images (infra/image/Dockerfile)
# run, so a node holds what the tests ran against.
#
#   bash infra/image/install.sh PYTHON [--torch-index URL] REQUIREMENT...
#
# e.g. `bash infra/image/install.sh .venv/bin/python -e '.[dev]'` (the Makefile), or
# `... python --torch-index https://download.pytorch.org/whl/cpu /wheels/cpr_ray-*.whl` (the
# CPU image). torch comes at the version constraints.txt pins (every constraint there holds):
# from the index given (the CPU build's), else from pip's configured sources and PyPI (whose
# Linux wheel is the CUDA build, which the GPU image takes).
#
# uv resolves and installs in seconds what pip takes two minutes for; it does not read pip's
# config, so the machine's wheel folders and indexes are passed from it (on a dev machine a
# local torch CPU wheel may be among them). It compiles the bytecode as pip does: with
# PYTHONDONTWRITEBYTECODE set every Ray worker would otherwise parse torch and ray from source,
# and a test run takes 1.6 times as long. Should uv fail, pip installs the same set. pip itself
# is not upgraded first: only that fallback uses it, and upgrading it cost every fresh install
# (each CI run) ~9 s on 2 cores.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$1"
shift
torch_index=()
if [ "${1:-}" = --torch-index ]; then
  torch_index=(--extra-index-url "$2")
  shift 2
fi

sources=()
for link in $("$py" -m pip config get global.find-links 2>/dev/null || true); do
  sources+=(--find-links "$link")
done
for url in $("$py" -m pip config get global.extra-index-url 2>/dev/null || true); do
  sources+=(--extra-index-url "$url")
done

"$py" -m pip install -q --upgrade uv
"$py" -m uv pip install --python "$py" -q -c "$root/constraints.txt" "${sources[@]}" \
  "${torch_index[@]}" --index-strategy unsafe-best-match --compile-bytecode torch "$@" \
  || "$py" -m pip install -q -c "$root/constraints.txt" "${torch_index[@]}" torch "$@"
