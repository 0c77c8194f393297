#!/usr/bin/env bash
# On the GPU machine: install opsmith, run the opsmith.ops tests (CPU ones and the gpu ones),
# time the cold compile of every ops kernel (one at a time vs all at once), then the ops
# benchmark against torch eager, torch.compile and the tutorial's kernel; the table is last.
# Everything lands under $OUT/ops/ (pytest.log, cold.json, results.json, table.txt, ops.png, bench.log).
#   bash scripts/gpu_check_ops.sh [extra bench_ops.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT/ops"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/opsmith-ops-pip.log 2>&1 \
  || { tail -20 /tmp/opsmith-ops-pip.log; exit 1; }
python3 -m pytest -q -p no:cacheprovider tests/ops/test_ops_compile.py tests/ops/test_ops_gpu.py 2>&1 \
  | tee "$OUT/ops/pytest.log" | tail -30
ARCH=$(python3 -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"sm_{p.major}{p.minor}")')
python3 bench/cold_ops.py --arch "$ARCH" --json "$OUT/ops/cold.json" 2>&1 | tail -3
python3 bench/bench_ops.py --out "$OUT/ops" "$@" 2>&1 | tee "$OUT/ops/bench.log" | tail -90
