#!/usr/bin/env bash
# Everything GPU in one device call: install opsmith, every gpu-marked test, the demo, and the
# GPU benchmarks (NVRTC kernels; nvcc extensions). Full logs and JSON go to $OUT; a short table
# is printed last.   bash scripts/gpu_check.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null   # as a regular install would: warm loads read .pyc
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ >"$OUT/pytest_gpu.log" 2>&1; rc_tests=$?
export OPSMITH_CACHE_DIR=$(mktemp -d)
opsmith demo >"$OUT/demo.log" 2>&1; rc_demo=$?
if [ "${1:-}" != "--quick" ]; then
  python3 bench/bench_kernels.py --out "$OUT/bench_kernels.json" >"$OUT/bench_kernels.log" 2>&1
  python3 bench/bench_cuda_ext.py --out "$OUT/bench_cuda_ext.json" >"$OUT/bench_cuda_ext.log" 2>&1
fi
echo "== gpu tests (rc=$rc_tests) =="; tail -3 "$OUT/pytest_gpu.log"
echo "== demo (rc=$rc_demo) =="; cat "$OUT/demo.log"
for f in bench_kernels bench_cuda_ext; do
  [ -f "$OUT/$f.log" ] && { echo "== $f =="; tail -14 "$OUT/$f.log"; }
done
exit $(( rc_tests || rc_demo ))
