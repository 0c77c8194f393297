#!/usr/bin/env bash
# export-c on a GPU machine: the CI tests, the GPU tests (the C++ example on every device) and the
# benchmark (launch host cost vs bare cuLaunchKernel; export of 100 kernels cold).
# Results as JSON under $OUT/export_c/; a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
dir="$OUT/export_c"
mkdir -p "$dir"
python3 -m pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$dir/gpus.csv" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/export_c/test_export_c.py tests/export_c/test_export_c_gpu.py -rs -s \
    --junitxml="$dir/tests.xml" > "$dir/tests.log" 2>&1
tests_rc=$?
examples/export_c/build.sh "$dir/example" > "$dir/example_build.log" 2>&1
for d in 0 1; do
    if [ "$d" -lt "$(nvidia-smi -L | wc -l)" ]; then
        "$dir/example/example" "$d" > "$dir/example_device$d.txt" 2>&1; echo "example device $d rc=$?" >> "$dir/example_rc.txt"
    fi
done
python3 bench/bench_export_c_launch.py --out "$dir/bench.json" > "$dir/bench.txt" 2>&1
bench_rc=$?
python3 - "$dir" "$tests_rc" "$bench_rc" <<'PY'
import json, sys, pathlib
d, tests_rc, bench_rc = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
summary = {"tests_rc": int(tests_rc), "bench_rc": int(bench_rc),
           "tests_tail": (d / "tests.log").read_text().splitlines()[-3:],
           "example": (d / "example_rc.txt").read_text().split("\n") if (d / "example_rc.txt").exists() else []}
try:
    summary["bench"] = json.loads((d / "bench.json").read_text())
except (OSError, ValueError):
    summary["bench"] = None
(d / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print("export-c on the GPU machine")
print(f"  tests: rc={tests_rc}  {' | '.join(summary['tests_tail'][-1:])}")
print(f"  example: {'; '.join(x for x in summary['example'] if x)}")
print("  " + "\n  ".join((d / "bench.txt").read_text().strip().splitlines()[-2:]))
PY
