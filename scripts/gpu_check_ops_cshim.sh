#!/usr/bin/env bash
# On the GPU machine: install opsmith, run the custom_op GPU tests (the C-shim ones and the
# general ones, which take the C-shim path where they fit), then the per-call overhead benchmark.
# Everything lands under $OUT/op_overhead/ (pytest.log, results.json, COMMAND.txt, bench.log);
# the benchmark's table is printed last.
#   bash scripts/gpu_check_ops_cshim.sh [extra bench_op_overhead.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT/op_overhead"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/opsmith-cshim-pip.log 2>&1 \
  || { tail -20 /tmp/opsmith-cshim-pip.log; exit 1; }
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/torch/test_torch_ops_cshim_gpu.py tests/torch/test_torch_ops_cshim.py \
  tests/torch/test_torch_ops_gpu.py 2>&1 | tee "$OUT/op_overhead/pytest.log" | tail -25
CMD="python3 bench/bench_op_overhead.py --json $OUT/op_overhead/results.json $*"
echo "$CMD" > "$OUT/op_overhead/COMMAND.txt"
$CMD 2>&1 | tee "$OUT/op_overhead/bench.log" | tail -24
