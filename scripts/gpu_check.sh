#!/usr/bin/env bash
# Everything GPU in one device call: install opsmith (with its C launcher), the NVRTC gpu tests,
# the nvcc-extension gpu tests, the kernel benchmark, the nvcc-extension benchmark, the warm-load
# profile and the demo. Logs go to $OUT/logs (packed into $OUT/logs.tgz, because a device call
# returns only a few files); the two benchmark JSONs stay beside it; a short table is printed last.
#   bash scripts/gpu_check.sh [--skip-torch-ext]   (--skip-torch-ext: no torch load_inline anchor
#                                                    in the kernel benchmark; it takes ~50 s)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; L="$OUT/logs"; mkdir -p "$L"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -V; git log -1 --format=%H; } \
  | tee "$L/versions.txt"
python3 -m pip install --no-deps --no-build-isolation -e . >"$L/pip.log" 2>&1 || { tail -20 "$L/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null   # as a regular install would: warm loads read .pyc
python3 -c "import opsmith._claunch as c; print('C launcher:', c.__file__)" 2>&1 | tee -a "$L/versions.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_nvrtc.py tests/test_kernel_args.py tests/test_kernel_gpu.py \
  tests/test_claunch.py >"$L/pytest_kernels.log" 2>&1; rc_k=$?
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_ext_gpu.py tests/test_doctor.py \
  tests/test_nvcc_split.py >"$L/pytest_cuda_ext.log" 2>&1; rc_x=$?
python3 bench/bench_kernels.py --out "$OUT/bench_kernels.json" "$@" >"$L/bench_kernels.log" 2>&1
python3 bench/bench_cuda_ext.py --out "$OUT/bench_cuda_ext.json" >"$L/bench_cuda_ext.log" 2>&1
python3 bench/profile_warm.py --out "$L" >"$L/profile_warm.log" 2>&1
OPSMITH_CACHE_DIR=$(mktemp -d) opsmith demo >"$L/demo.log" 2>&1; rc_demo=$?
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
tar -xzf "$OUT/logs.tgz" -C /tmp && L=/tmp/logs
echo "== kernel tests (rc=$rc_k) =="; tail -3 "$L/pytest_kernels.log"
echo "== cuda-ext gpu tests (rc=$rc_x) =="; tail -3 "$L/pytest_cuda_ext.log"
echo "== demo (rc=$rc_demo) =="; tail -12 "$L/demo.log"
echo "== profile_warm =="; grep -E "RESULT|warm:|first:" "$L/profile_warm.log" | head -24
echo "== bench_kernels =="; tail -34 "$L/bench_kernels.log"
echo "== bench_cuda_ext =="; tail -16 "$L/bench_cuda_ext.log"
exit $(( rc_k || rc_x || rc_demo ))
