#!/usr/bin/env bash
# Set up opsmith on a fresh Debian/Ubuntu machine: clang (fastest torch precompiled headers),
# ninja, torch (CPU build unless one is installed), opsmith itself, and with --test the test deps.
# Usage: bash scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if ! command -v clang++ >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  # clang's precompiled headers cut a torch/extension.h compile from ~29 s to ~4 s (gcc: ~10 s).
  # opsmith works with gcc alone; clang is only faster.
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq clang >/dev/null || echo "setup: clang not installed; opsmith will use gcc"
fi
if [ "${1:-}" = "--test" ] && ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  # The cluster-cache tests start a real redis-server on a loopback port (they skip without one).
  $SUDO apt-get install -y -qq redis-server >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null; } \
    || echo "setup: redis-server not installed; the Redis cache tests will skip and say why"
fi
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  # Any torch>=2.4 works. Prefer a wheel already on the machine (pip's find-links), then the
  # small CPU build, then PyPI's default (which pulls several GB of CUDA libraries).
  python -m pip install -q --no-index --no-deps "torch>=2.4" 2>/dev/null \
    || python -m pip install -q --no-deps "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
    || true
  python -m pip install -q "torch>=2.4"   # torch's own dependencies (or torch itself, if none above worked)
fi
EXTRAS="cuda"
[ "${1:-}" = "--test" ] && EXTRAS="test,cuda"
python -m pip install -q -e ".[${EXTRAS}]"
if [ "${1:-}" = "--test" ] && ! command -v nvcc >/dev/null 2>&1; then
  # nvcc from PyPI (no GPU needed): the CUDA-extension tests compile .cu files on CI too.
  python -m pip install -q "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-cccl==13.0.*" \
    "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*" \
    || echo "setup: nvcc wheels not installed; the nvcc tests will skip and say why"
fi
python -c "import opsmith, torch; print('opsmith', opsmith.__version__, 'with torch', torch.__version__)"
