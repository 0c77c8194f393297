#!/usr/bin/env bash
# Issue 21 on the GPU machine: build the ReLU package and the opsmith.ops kernels package with
# this machine's NVRTC, install both with --no-deps, run them in fresh processes with no
# compiler on PATH and NVRTC unimportable (zero compiles), compare with the JIT path bitwise,
# and time import + registration after `import torch`. Prints a short table last.
#   bash scripts/gpu_check.sh package
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT"
W=$(mktemp -d); export OPSMITH_CACHE_DIR="$W/cache"
python3 -m pip install --no-deps --no-build-isolation -e . >"$W/pip.log" 2>&1 || { tail -20 "$W/pip.log"; exit 1; }
PY=$(python3 -c 'import sys; print(sys.executable)')
(cd examples/package_relu && python3 -m opsmith package relupkg -o "$W/wheels" --json) >"$OUT/package_relu.json" 2>"$OUT/package_relu.err"
echo "relupkg rc=$?"
[ "${PKG_OPS:-1}" != 0 ] && python3 -m opsmith package --ops -o "$W/wheels" --json >"$OUT/package_ops.json" 2>"$OUT/package_ops.err"
echo "ops package rc=$?"
ls -l "$W/wheels" | tee "$OUT/wheels.txt"
python3 -m pip install -q --no-deps --no-index --target "$W/site" "$W"/wheels/*.whl >"$W/pip2.log" 2>&1 || tail -5 "$W/pip2.log"
mkdir -p "$W/nobin"  # PATH: an empty folder (no cc, c++, nvcc); python is run by its own path (a venv's)
export -n OPSMITH_CACHE_DIR
pkg_env() { env -u OPSMITH_CUDA_ARCH -u CC -u CXX -u CUDA_HOME PATH="$W/nobin" PYTHONPATH="$W/site:$PWD" \
            OPSMITH_CACHE_DIR="$W/pkg-cache" "$@"; }
pkg_env "$PY" tests/package/installed_check.py relupkg --cuda --block-nvrtc --save "$W/pkg.pt" \
  >"$OUT/installed_cuda.json" 2>"$OUT/installed_cuda.err"; echo "installed check rc=$?"
for i in 1 2 3 4 5 6 7 8 9 10 11; do  # import + registration time, fresh process each (the first fills the state)
  pkg_env "$PY" tests/package/installed_check.py relupkg --block-nvrtc 2>/dev/null | tail -1 >>"$OUT/import_times.jsonl"
done
pkg_env "$PY" -c "import torch, cProfile, pstats; cProfile.run('import relupkg', '$W/prof'); pstats.Stats('$W/prof').sort_stats('cumtime').print_stats(35)" \
  >"$OUT/import_profile.txt" 2>&1
# the JIT path: the same outputs with no package on the path (NVRTC compiles, native C++ kernels)
python3 - "$W/pkg.pt" >"$OUT/jit_compare.txt" 2>&1 <<'PYEOF'
import os, sys, torch
sys.path.insert(0, os.path.join(os.getcwd(), "examples/package_relu"))
os.environ["OPSMITH_CACHE_DIR"] = sys.argv[1] + ".jit-cache"
import relupkg, importlib.util
spec = importlib.util.spec_from_file_location("chk", "tests/package/installed_check.py")
chk = importlib.util.module_from_spec(spec); spec.loader.exec_module(chk)
pkg = torch.load(sys.argv[1], weights_only=True)
jit = chk._outputs(torch, torch.ops.relupkg, ops=len(pkg) > 1)
bad = [k for k in pkg if not torch.equal(jit[k], pkg[k])]
from opsmith._build import _nvrtc
print(f"bitwise equal: {len(pkg) - len(bad)}/{len(pkg)}; differ: {bad}; JIT NVRTC compiles: {_nvrtc.nvrtc_stats['compiles']}")
PYEOF
cp "$W"/wheels/*.whl "$OUT/" 2>/dev/null
echo "== package on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) =="
python3 - "$OUT" <<'PYEOF'
import json, os, statistics, sys
out = sys.argv[1]
for f in ("package_relu.json", "package_ops.json"):
    try:
        d = json.load(open(os.path.join(out, f)))
        print(f"{d['package']:<22} {d['kernels']:>3} programs  archs {','.join(d['archs'])}  wheel {d['sizes']['wheel']:,} B  "
              f"{d['seconds']:.1f} s")
        print("   per arch (uncompressed):", {k: v for k, v in d["sizes"].items() if k != "wheel"})
    except Exception as exc:
        print(f, "missing:", exc, open(os.path.join(out, f.replace(".json", ".err"))).read()[-1500:])
try:
    c = json.load(open(os.path.join(out, "installed_cuda.json")))
    print("installed (no compiler, no NVRTC):", {k: c[k] for k in ("nvrtc", "prebuilt", "cuda_equal", "cuda_grad_equal",
          "cuda_ops_equal", "cpu_ok", "fake_ok", "torch")})
except Exception as exc:
    print("installed check failed:", exc, open(os.path.join(out, "installed_cuda.err")).read()[-2500:])
times = [json.loads(l)["import_ms"] for l in open(os.path.join(out, "import_times.jsonl")) if l.strip()]
print("import + registration after import torch, ms:", [round(t, 1) for t in times],
      "median of runs 2..:", round(statistics.median(times[1:]), 1) if len(times) > 1 else None)
print(open(os.path.join(out, "jit_compare.txt")).read()[-1500:])
PYEOF
