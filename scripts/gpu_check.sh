#!/usr/bin/env bash
# The GPU checks in one go, for a machine with CUDA (under 5 minutes). Uses the torch that is
# installed there; installs dpkit itself and the test tools without touching torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-build/gpu}
mkdir -p "$out"
python -m pip install -q --no-deps -e . 2>&1 | tail -n 2 || true
python -c "import pytest, hypothesis" 2>/dev/null || python -m pip install -q pytest hypothesis
python -m dpkit devices | tee "$out/devices.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.txt"
start=$(date +%s)
python -m pytest -p no:cacheprovider -m gpu -v tests/test_gpu.py 2>&1 | tee "$out/pytest-gpu.txt"
# The CPU suite too: the same primitives must still be exact where a GPU is present.
python -m pytest -p no:cacheprovider -q -m "not gpu and not browser and not notebooks" \
    2>&1 | tee "$out/pytest-rest.txt"
echo "gpu_check: $(( $(date +%s) - start )) s" | tee "$out/elapsed.txt"
