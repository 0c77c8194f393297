"""Where a warm load spends its time, in fresh processes: -X importtime and cProfile.

    python bench/profile_warm.py [--out DIR]

Profiles (a) an NVRTC kernel warm load after torch's CUDA is initialised and (b) the tutorial's
two-file CUDA extension warm load after ``import torch``, then times the pieces of a launch.
Writes the raw outputs under --out (default $OUT or a temp dir) and prints a summary.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = [os.path.join(ROOT, "examples", "tutorial_relu", f) for f in ("relu.cpp", "relu_kernel.cu")]

KERNEL = r'''
import os, sys, time, cProfile, pstats, io
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
RAW = open(sys.argv[1]).read()
prof = os.environ.get("PROFILE") == "1"
if prof:
    pr = cProfile.Profile(); pr.enable()
t0 = time.perf_counter()
import opsmith
opsmith.CudaModule
t1 = time.perf_counter()
k = opsmith.cuda_kernel(RAW, "relu_kernel")
t2 = time.perf_counter()
if prof:
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())
print(f"RESULT import_ms={1e3*(t1-t0):.3f} load_ms={1e3*(t2-t1):.3f}")
'''

EXT = r'''
import os, sys, time, cProfile, pstats, io
import torch
prof = os.environ.get("PROFILE") == "1"
if prof:
    pr = cProfile.Profile(); pr.enable()
t0 = time.perf_counter()
import opsmith
t1 = time.perf_counter()
m = opsmith.load("myrelu", sys.argv[1:])
t2 = time.perf_counter()
if prof:
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())
print(f"RESULT import_ms={1e3*(t1-t0):.3f} load_ms={1e3*(t2-t1):.3f}")
'''

LAUNCH = r'''
import timeit, torch, ctypes
x = torch.randn(1, device="cuda")
g = torch._C._cuda_getCurrentRawStream
d = torch._C._cuda_getDevice
for name, fn in [("x.data_ptr()", x.data_ptr), ("x.is_contiguous()", x.is_contiguous),
                 ("x.get_device()", x.get_device), ("x.dtype", lambda: x.dtype),
                 ("rawstream(0)", lambda: g(0)), ("getdev()", d), ("lambda: None", lambda: None)]:
    n = 200000
    t = min(timeit.repeat(fn, number=n, repeat=5)) / n
    print(f"RESULT {name}: {t*1e9:.0f} ns")
'''


def run(code, args, env, out, name):
    p = subprocess.run([sys.executable, *args, "-c", code, *env.pop("_ARGV", [])], capture_output=True,
                       text=True, env=env)
    with open(os.path.join(out, name), "w") as f:
        f.write(p.stdout + "\n--- stderr ---\n" + p.stderr)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    a = ap.parse_args()
    out = os.path.join(a.out, "profile_warm")
    os.makedirs(out, exist_ok=True)
    base = dict(os.environ)
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    print("PYTHON env:", {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}, "flags:", sys.flags)
    kfile = os.path.join(out, "relu.cu")
    with open(kfile, "w") as f:
        f.write('extern "C" __global__ void relu_kernel(const float* x, float* y, long long n) {\n'
                '  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n'
                '  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;\n}\n')
    cache = tempfile.mkdtemp()
    for what, code, argv in (("kernel", KERNEL, [kfile]), ("ext", EXT, SRC)):
        env = dict(base, OPSMITH_CACHE_DIR=os.path.join(cache, what), OPSMITH_PCH="0")
        first = run(code, [], dict(env, _ARGV=argv), out, f"{what}_first.txt")
        print(what, "first:", first.stdout.strip().splitlines()[-1:] or first.stderr[-2000:])
        rs = []
        for i in range(7):
            p = run(code, [], dict(env, _ARGV=argv), out, f"{what}_warm{i}.txt")
            rs.append(p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-500:])
        print(what, "warm:", *rs, sep="\n  ")
        run(code, ["-X", "importtime"], dict(env, _ARGV=argv), out, f"{what}_importtime.txt")
        run(code, [], dict(env, PROFILE="1", _ARGV=argv), out, f"{what}_cprofile.txt")
    p = run(LAUNCH, [], dict(base), out, "launch_pieces.txt")
    print(p.stdout, p.stderr[-1000:])


if __name__ == "__main__":
    main()
