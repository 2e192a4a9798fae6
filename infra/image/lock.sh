#!/usr/bin/env bash
# Writes the exact versions every install of this package takes, one lock per image target, from
# one source (pyproject.toml, with constraints.txt's torch pin):
#
#   bash infra/image/lock.sh            # rewrites infra/image/cpu.lock and infra/image/gpu.lock
#
# - cpu.lock: the package with its `cpu` and `dev` extras: `make install` (a laptop, CI) and the
#   CPU image (infra/image/Dockerfile, target cpu) take their versions from it.
# - gpu.lock: the package with its `gpu` extra: the GPU image's versions (faiss's CUDA build
#   instead of faiss-cpu).
#
# install.sh installs under the target's lock as constraints, so a package already in Ray's base
# image (boto3, numpy, urllib3 ...) is moved to the locked version instead of kept because it
# satisfies a loose requirement, and an image holds what CI tested. Run this after changing a
# dependency in pyproject.toml or constraints.txt, and commit the locks with it
# (tests/infra/test_image_start.py checks they still satisfy pyproject.toml).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
# PyPI and pip's configured indexes (the dev extra names models published as packages there),
# not its wheel folders: a machine's local torch build must not decide the images' versions
sources=()
for url in $("$py" -m pip config get global.extra-index-url 2>/dev/null || true); do
  sources+=(--extra-index-url "$url")
done

compile() {
  local out="$1"
  shift
  (cd "$root" && "$py" -m uv pip compile -q pyproject.toml -c constraints.txt "${sources[@]}" \
    --index-strategy unsafe-best-match --no-emit-find-links --no-emit-index-url \
    --custom-compile-command "bash infra/image/lock.sh" "$@" -o "infra/image/$out")
}
# both for the images' platform and Python (CI's too); elsewhere `make install` takes the same
# versions where they have wheels
platform=(--python-platform x86_64-manylinux_2_28 --python-version 3.11)
compile cpu.lock --extra cpu --extra dev "${platform[@]}"
compile gpu.lock --extra gpu "${platform[@]}"
