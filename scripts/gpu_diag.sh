#!/usr/bin/env bash
# Device diagnostics for warm-load and launch costs (no tests): install, then bench/profile_warm.py.
#   bash scripts/gpu_diag.sh      (writes under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)|MHz"; \
  python3 -c "import sys; print(sys.version)"; df -T . /tmp | tail -2; env | grep -E "^PYTHON|^OPSMITH" ; } | tee "$OUT/machine.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null
python3 -c "import opsmith, sys; print(opsmith.__file__, len(sys.path), sys.meta_path)"
python3 bench/profile_warm.py --out "$OUT" 2>&1 | tee "$OUT/profile_warm.log"
