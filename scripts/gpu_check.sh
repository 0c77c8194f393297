#!/usr/bin/env bash
# Everything GPU in one device call: install opsmith (with its C launcher), the NVRTC gpu tests,
# the nvcc-extension gpu tests, the kernel benchmark, the nvcc-extension benchmark, the warm-load
# profile and the demo. Logs go to $OUT/logs (packed into $OUT/logs.tgz, because a device call
# returns only a few files); the two benchmark JSONs stay beside it; a short table is printed last.
#   bash scripts/gpu_check.sh [kernels|ext|all] [--skip-torch-ext]
#     kernels: NVRTC tests + kernel benchmark + warm profile + demo (~4 min)
#     ext:     nvcc-extension gpu tests + CUDA-extension benchmark (~8 min)
#     all (default): both, ~12 min: more than one 600 s device call allows, so run the parts
#     in two calls there. --skip-torch-ext: no torch load_inline anchor in the kernel benchmark.
#   EXT_BENCH_ARGS="--parts two" (or "--parts inline --inline-repeat 2") is passed to
#   bench/bench_cuda_ext.py, to fit the ext part into one call.
set -uo pipefail
PART=all; case "${1:-}" in kernels|ext|all) PART=$1; shift;; esac
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; L="$OUT/logs"; mkdir -p "$L"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -V; git log -1 --format=%H; } \
  | tee "$L/versions.txt"
python3 -m pip install --no-deps --no-build-isolation -e . >"$L/pip.log" 2>&1 || { tail -20 "$L/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null   # as a regular install would: warm loads read .pyc
python3 -c "import opsmith._runtime._claunch as c; print('C launcher:', c.__file__)" 2>&1 | tee -a "$L/versions.txt"
rc_k=0; rc_x=0; rc_demo=0
if [ "$PART" != ext ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_nvrtc.py tests/test_kernel_args.py tests/test_kernel_gpu.py \
    tests/test_claunch.py >"$L/pytest_kernels.log" 2>&1; rc_k=$?
  python3 bench/bench_kernels.py --out "$OUT/bench_kernels.json" "$@" >"$L/bench_kernels.log" 2>&1
  OPSMITH_CACHE_DIR=$(mktemp -d) opsmith demo >"$L/demo.log" 2>&1; rc_demo=$?
  python3 bench/profile_warm.py --out "$L" >"$L/profile_warm.log" 2>&1
fi
if [ "$PART" != kernels ]; then
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_ext_gpu.py tests/test_doctor.py \
    tests/test_nvcc_split.py >"$L/pytest_cuda_ext.log" 2>&1; rc_x=$?
  # shellcheck disable=SC2086
  python3 bench/bench_cuda_ext.py --out "$OUT/bench_cuda_ext.json" ${EXT_BENCH_ARGS:-} >"$L/bench_cuda_ext.log" 2>&1
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
X=$(mktemp -d); tar -xzf "$OUT/logs.tgz" -C "$X" && L="$X/logs"
show() { [ -f "$L/$2" ] && { echo "== $1 =="; tail -"$3" "$L/$2"; }; }
show "kernel tests (rc=$rc_k)" pytest_kernels.log 3
show "demo (rc=$rc_demo)" demo.log 8
show "profile_warm" profile_warm.log 24
show "bench_kernels" bench_kernels.log 36
show "cuda-ext gpu tests (rc=$rc_x)" pytest_cuda_ext.log 3
show "bench_cuda_ext" bench_cuda_ext.log 20
exit $(( rc_k || rc_x || rc_demo ))
