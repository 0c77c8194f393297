"""Warm load of the tutorial's two-file CUDA extension in fresh processes (after `import torch`).

    python bench/warm_cuda_ext.py [--runs 9] [--out FILE]
Builds it once in a fresh cache (no PCH, to keep the run short), then times `opsmith.load`
in fresh processes and prints the median.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = [os.path.join(HERE, "..", "examples", "tutorial_relu", f) for f in ("relu.cpp", "relu_kernel.cu")]
CHILD = r'''
import sys, time, json
import torch
t0 = time.perf_counter()
import opsmith
m = opsmith.load("myrelu", sys.argv[1:])
t1 = time.perf_counter()
x = torch.randn(4096, device="cuda")
ok = bool(torch.allclose(m.relu(x), torch.relu(x)))
print(json.dumps({"load_ms": (t1 - t0) * 1e3, "ok": ok}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out")
    a = ap.parse_args()
    env = dict(os.environ, OPSMITH_CACHE_DIR=tempfile.mkdtemp(), OPSMITH_PCH="0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    first = subprocess.run([sys.executable, "-c", CHILD, *SRC], env=env, capture_output=True, text=True)
    if first.returncode:
        raise SystemExit(first.stderr[-3000:])
    runs = []
    for _ in range(a.runs):
        p = subprocess.run([sys.executable, "-c", CHILD, *SRC], env=env, capture_output=True, text=True)
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    ms = [r["load_ms"] for r in runs]
    res = {"cold_ms": json.loads(first.stdout.strip().splitlines()[-1])["load_ms"],
           "warm_ms_median": statistics.median(ms), "warm_ms": ms, "ok": all(r["ok"] for r in runs),
           "command": "python " + " ".join(sys.argv)}
    print(f"tutorial two-file CUDA extension: warm load (import opsmith + load, after import torch) "
          f"median {res['warm_ms_median']:.2f} ms over {len(ms)} fresh processes; correct={res['ok']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
