"""Run time of a module built by torch's `load` and by `opsmith.load` from one source, one run.

    python bench/bench_runtime.py [--calls 2000] [--repeats 5] [--threads N] [--out FILE.json]

The source is bench/lltm/lltm.cpp (the LLTM cell of PyTorch's extension tutorial, ATen ops
only): each `forward(X, W, B, h, c)` call on float64 CPU tensors (16x32 input, state 128) is
almost all dispatch and header code, so the build's compiler and flags show in its time.
Every phase runs in a fresh process with its own empty build directory or cache, builds,
then at once times `--repeats` rounds of `--calls` forward calls (after 50 warm-up calls) and
reports their median and the first round (the calls right after `load`, as a user's script
makes them):

- torch:      torch.utils.cpp_extension.load (its compiler, its flags)
- ours_first: opsmith.load into an empty cache: no precompiled torch header yet, so one is
              built in the background after this build, while this phase times its calls
- ours_pch:   once that header is built, opsmith.load of the same source (one comment added:
              a new key) compiled with it

Each phase's outputs are compared with torch's build's (same inputs, bit for bit).
``--threads N`` sets torch's intra-op threads in every phase (default: torch's own, one per
core). On a small shared machine any other busy process slows every phase alike (an intra-op
thread waits for one that lost its core); run it when the machine is otherwise idle.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "lltm", "lltm.cpp")

CHILD = r'''
import hashlib, json, os, statistics, sys, time
tool, source, calls, repeats, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
import torch
if threads:
    torch.set_num_threads(threads)
t0 = time.perf_counter()
if tool == "torch":
    from torch.utils.cpp_extension import load
    m = load(name="lltm_cpp", sources=[source], build_directory=os.environ["BENCH_BUILD_DIR"])
else:
    import opsmith
    m = opsmith.load("lltm_cpp", [source])
build_s = time.perf_counter() - t0
g = torch.Generator().manual_seed(0)
def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64, generator=g)
X, h, c, W, B = rand(16, 32), rand(16, 128), rand(16, 128), rand(3 * 128, 128 + 32), rand(1, 3 * 128)
out = m.forward(X, W, B, h, c)
digest = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in out)).hexdigest()
for _ in range(50):
    m.forward(X, W, B, h, c)
rounds = []
for _ in range(repeats):
    t = time.perf_counter()
    for _ in range(calls):
        m.forward(X, W, B, h, c)
    rounds.append(time.perf_counter() - t)
print("RESULT " + json.dumps({"build_s": build_s, "rounds_s": rounds, "median_s": statistics.median(rounds),
                              "threads": torch.get_num_threads(), "digest": digest}))
'''


def phase(tool: str, source: str, env: dict, args) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, tool, source, str(args.calls), str(args.repeats),
                          str(args.threads)],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{tool} phase failed:\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def wait_for_pch(cache: str, timeout: float) -> float | None:
    """Seconds until the background build of the precompiled header finished (None: it did not)."""
    t0 = time.perf_counter()
    logs = os.path.join(cache, "logs")
    while time.perf_counter() - t0 < timeout:
        for name in os.listdir(logs) if os.path.isdir(logs) else ():
            if name.startswith("pch-"):
                with open(os.path.join(logs, name), errors="replace") as f:
                    text = f.read()
                if "precompiled torch headers built" in text:
                    return time.perf_counter() - t0
                if "FAILED" in text:
                    return None
        time.sleep(0.5)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: its default)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-runtime-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPSMITH_") and k != "TORCH_EXTENSIONS_DIR"}
    try:
        results = {}
        torch_dir = os.path.join(tmp, "torch-build")
        os.makedirs(torch_dir)
        results["torch"] = phase("torch", SOURCE, dict(base, BENCH_BUILD_DIR=torch_dir,
                                                       TORCH_EXTENSIONS_DIR=os.path.join(tmp, "torch-ext")), args)
        cache = os.path.join(tmp, "opsmith-cache")
        ours_env = dict(base, OPSMITH_CACHE_DIR=cache)
        results["ours_first"] = phase("ours", SOURCE, ours_env, args)
        waited = wait_for_pch(cache, timeout=300)
        if waited is None:
            print("the precompiled header was not built; ours_pch skipped (see its log in "
                  f"{cache}/logs)", file=sys.stderr)
        else:
            copy = os.path.join(tmp, "lltm.cpp")
            with open(SOURCE) as f, open(copy, "w") as g:
                g.write(f.read() + "\n// a new key: compiled with the precompiled header\n")
            results["ours_pch"] = phase("ours", copy, ours_env, args)
        ref = results["torch"]
        print(f"{args.repeats} x {args.calls} LLTM forward calls (float64, 16x32, state 128), "
              f"median of the rounds; torch threads: {ref['threads']}")
        print(f"{'phase':12s} {'build s':>8s} {'median s':>9s} {'x torch':>8s} {'first s':>8s} {'x torch':>8s}  rounds")
        for name, r in results.items():
            same = "" if r["digest"] == ref["digest"] else "  OUTPUTS DIFFER FROM TORCH'S BUILD"
            first = r["rounds_s"][0]
            print(f"{name:12s} {r['build_s']:8.2f} {r['median_s']:9.3f} {r['median_s'] / ref['median_s']:8.2f} "
                  f"{first:8.3f} {first / ref['rounds_s'][0]:8.2f}  "
                  + " ".join(f"{x:.3f}" for x in r["rounds_s"]) + same)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                           "machine": platform.platform(), "cores": os.cpu_count(), "calls": args.calls,
                           "repeats": args.repeats, "results": results}, f, indent=1)
        if any(r["digest"] != ref["digest"] for r in results.values()):
            sys.exit(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
