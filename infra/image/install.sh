#!/usr/bin/env bash
# Installs this package and its dependencies into PYTHON's environment: the one install both
# `make install` (a virtualenv here and in CI) and the cluster images (infra/image/Dockerfile)
# run, so a node holds what the tests ran against.
#
#   bash infra/image/install.sh PYTHON [--dry-run] --lock cpu|gpu [--torch-index URL] REQUIREMENT...
#
# e.g. `bash infra/image/install.sh .venv/bin/python --lock cpu -e '.[cpu,dev]'` (the Makefile),
# or `... python --lock cpu --torch-index https://download.pytorch.org/whl/cpu WHEEL[cpu]` (the
# CPU image). Every package comes at the version infra/image/cpu.lock or gpu.lock pins (made by
# lock.sh from pyproject.toml and constraints.txt), also one already installed: Ray's images
# ship older boto3, numpy, urllib3 ... than the code needs, and a loose requirement they satisfy
# would keep them. torch comes from the index given (the CPU build's), else from pip's
# configured sources and PyPI (whose Linux wheel is the CUDA build, which the GPU image takes).
# --dry-run resolves and prints what would change, installing nothing
# (tests/infra/test_image_start.py runs it on a copy of an image's starting point).
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
dry_run=()
if [ "${1:-}" = --dry-run ]; then
  dry_run=(--dry-run)
  shift
fi
if [ "${1:-}" != --lock ] || [ ! -f "$root/infra/image/${2:-}.lock" ]; then
  echo "error: install.sh needs --lock cpu or --lock gpu before the requirements" >&2
  exit 2
fi
lock="$root/infra/image/$2.lock"
shift 2
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

if [ ${#dry_run[@]} -eq 0 ]; then
  "$py" -m pip install -q --upgrade uv
  quiet=(-q --compile-bytecode)
else  # the plan only: what uv would install, upgrade and remove
  quiet=()
fi
"$py" -m uv pip install --python "$py" "${dry_run[@]}" "${quiet[@]}" -c "$lock" "${sources[@]}" \
  "${torch_index[@]}" --index-strategy unsafe-best-match torch "$@" \
  || { [ ${#dry_run[@]} -eq 0 ] && "$py" -m pip install -q -c "$lock" "${torch_index[@]}" torch "$@"; }
