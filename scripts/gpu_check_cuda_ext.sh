#!/usr/bin/env bash
# On the GPU machine: install opsmith, run the CUDA-extension tests (CI's and the gpu ones),
# then the benchmark against torch; the benchmark's table is printed last.
#   bash scripts/gpu_check_cuda_ext.sh [--skip-torch]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -2; g++ --version | head -1; nproc
} 2>&1 | tee "$OUT/versions.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null  # as a regular install would: warm loads read .pyc
[ -n "${SKIP_TESTS:-}" ] || timeout 200 python3 -m pytest -q -p no:cacheprovider tests/build/test_nvcc.py tests/torch/test_cuda_ext_gpu.py -m "gpu or not gpu" \
  --durations=10 2>&1 | tee "$OUT/pytest.log" | tail -30
timeout ${BENCH_TIMEOUT:-370} python3 bench/bench_cuda_ext.py --out "$OUT/cuda_ext.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -25
