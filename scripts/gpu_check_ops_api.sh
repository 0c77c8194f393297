#!/usr/bin/env bash
# On the GPU machine: install opsmith, run the custom_op tests (CI's and the gpu ones), then the
# per-call overhead benchmark; results under $OUT/ops_api/, the benchmark's table printed last.
#   bash scripts/gpu_check_ops_api.sh [--calls 5000 --rounds 9]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; D="$OUT/ops_api"; mkdir -p "$D"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee "$D/versions.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$D/pip.log" 2>&1 || { tail -20 "$D/pip.log"; exit 1; }
python3 -m pytest -q -p no:cacheprovider -rs tests/torch/test_torch_ops.py tests/torch/test_torch_ops_gpu.py \
  --junitxml="$D/pytest.xml" 2>&1 | tee "$D/pytest.log" | tail -30
python3 bench/bench_op_overhead.py --json "$D/bench_op_overhead.json" "$@" 2>&1 | tee "$D/bench.log" | tail -25
