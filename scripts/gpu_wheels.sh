#!/usr/bin/env bash
# Fetch what scripts/gpu_check.py needs beyond torch, for a GPU machine without network, into
# build/gpu_wheels/ (ignored by git): pytest and its dependencies as pure-Python wheels for
# Python 3.10 to 3.13, and hypothesis (compiled since 6.15x: one CPython 3.11+ abi3 wheel for
# x86_64 Linux; only the optional CPU suite needs it). Versions are pinned to those in .venv,
# what the suite runs with here. Run it here, with network, then carry the folder; on the GPU
# machine gpu_check.py unpacks the wheels into a temporary folder on the path, installing
# nothing.
#
#     bash scripts/gpu_wheels.sh                  # -> build/gpu_wheels/
#     bash scripts/gpu_wheels.sh some/other/dir
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=${1:-build/gpu_wheels}
python=${PYTHON:-.venv/bin/python}

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# The venv's versions pin every package it has; the rest (tomli, exceptiongroup for Python
# 3.10) resolve to the newest that fits.
"$python" -m pip freeze --exclude-editable | grep -E '^[A-Za-z0-9_.-]+==' >"$constraints"
download() {
    "$python" -m pip download --disable-pip-version-check --quiet --dest "$dest" \
        --only-binary=:all: -c "$constraints" "$@"
}

rm -rf "$dest"
mkdir -p "$dest"
for version in 3.10 3.11 3.12 3.13; do
    # --implementation py --abi none --platform any: pure-Python wheels only, or fail here.
    download --implementation py --abi none --platform any --python-version "$version" pytest
done
# pip evaluates markers such as `python_version < "3.11"` for the Python running it, not for
# --python-version: name pytest's backports for 3.10 explicitly.
download --implementation py --abi none --platform any --python-version 3.10 \
    exceptiongroup tomli typing_extensions
download --no-deps --python-version 3.11 --implementation cp --abi abi3 \
    --platform manylinux2014_x86_64 hypothesis
download --implementation py --abi none --platform any --python-version 3.11 sortedcontainers

ls -1 "$dest"
echo "$(find "$dest" -name '*.whl' | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest;" \
    "carry it to the GPU machine (scripts/README.md)"
