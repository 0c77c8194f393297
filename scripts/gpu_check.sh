#!/usr/bin/env bash
# Everything GPU in one device call: install opsmith, the NVRTC gpu tests, the kernel benchmark,
# the nvcc-extension benchmark, the demo, then the nvcc-extension gpu tests. Each step writes its
# log under $OUT as it goes; a short table is printed last.
#   bash scripts/gpu_check.sh [--skip-torch-ext]   (--skip-torch-ext: no torch load_inline anchor
#                                                    in the kernel benchmark; it takes ~50 s)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null   # as a regular install would: warm loads read .pyc
python3 -m pytest -q -p no:cacheprovider tests/test_nvrtc.py tests/test_kernel_args.py tests/test_kernel_gpu.py \
  >"$OUT/pytest_kernels.log" 2>&1; rc_k=$?
python3 bench/bench_kernels.py --out "$OUT/bench_kernels.json" "$@" >"$OUT/bench_kernels.log" 2>&1
python3 bench/bench_cuda_ext.py --out "$OUT/bench_cuda_ext.json" >"$OUT/bench_cuda_ext.log" 2>&1
OPSMITH_CACHE_DIR=$(mktemp -d) opsmith demo >"$OUT/demo.log" 2>&1; rc_demo=$?
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_ext_gpu.py tests/test_doctor.py \
  >"$OUT/pytest_cuda_ext.log" 2>&1; rc_x=$?
echo "== kernel tests (rc=$rc_k) =="; tail -2 "$OUT/pytest_kernels.log"
echo "== cuda-ext gpu tests (rc=$rc_x) =="; tail -2 "$OUT/pytest_cuda_ext.log"
echo "== demo (rc=$rc_demo) =="; cat "$OUT/demo.log"
echo "== bench_kernels =="; tail -16 "$OUT/bench_kernels.log"
echo "== bench_cuda_ext =="; tail -16 "$OUT/bench_cuda_ext.log"
exit $(( rc_k || rc_x || rc_demo ))
