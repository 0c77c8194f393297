#!/usr/bin/env bash
# On the GPU machine: install opsmith, run the NVRTC kernel tests (CI's and the gpu ones),
# then the benchmark; the benchmark's table is printed last.
#   bash scripts/gpu_check_kernels.sh [--skip-torch-ext]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, cuda.bindings; from cuda.bindings import nvrtc; print("torch", torch.__version__, "cuda", torch.version.cuda, "| cuda-bindings", cuda.bindings.__version__, "| nvrtc", nvrtc.nvrtcVersion()[1:])'
  python3 -m pip show -q nvidia-cuda-nvrtc 2>/dev/null | grep -i ^version
} 2>&1 | tee "$OUT/versions.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null  # as a regular install would: warm loads read .pyc
python3 -m pytest -q -p no:cacheprovider tests/build/test_nvrtc.py tests/torch/test_kernel_args.py tests/torch/test_kernel_gpu.py \
  2>&1 | tee "$OUT/pytest.log" | tail -40
python3 bench/bench_kernels.py --out "$OUT/bench_kernels.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -45
