#!/usr/bin/env bash
# Kept for old instructions: the GPU check is scripts/gpu_check.py (see scripts/README.md).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
python=${PYTHON:-$(command -v python || command -v python3)}
exec "$python" scripts/gpu_check.py "$@"
