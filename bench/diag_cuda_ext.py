"""Where the time goes in a CUDA extension build and warm load (diagnostics, one run on the GPU machine).

    python bench/diag_cuda_ext.py --out DIR

- the C++ standard torch's own builder passes to nvcc and g++ (grep of its source);
- the tutorial's two-file project built from an empty cache, with the build logs kept
  (a precompiled header gcc rejects shows there as `-Winvalid-pch`);
- warm loads in fresh processes, split into import / build (cache lookup) / load, and one
  profiled;
- ``nvcc --time`` on a .cu that includes torch headers, with -std=c++17 and with -std=c++20.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_cuda_ext import NVCC_TIME, RELU_CPP, RELU_CU, project  # noqa: E402

WARM = r'''
import json, os, sys, time
import torch
t0 = time.perf_counter()
import opsmith
t1 = time.perf_counter()
d = os.environ["BENCH_DIR"]
art = opsmith.build("myrelu", [os.path.join(d, "relu.cpp"), os.path.join(d, "relu_kernel.cu")])
t2 = time.perf_counter()
m = opsmith.load_artifact(art)
t3 = time.perf_counter()
out = {"import_ms": (t1 - t0) * 1e3, "build_ms": (t2 - t1) * 1e3, "load_ms": (t3 - t2) * 1e3,
       "total_ms": (t3 - t0) * 1e3, "built": art.built}
if os.environ.get("PROFILE"):  # a second process, profiled from its first call on
    import subprocess
    prof = """
import cProfile, io, os, pstats, time, torch
pr = cProfile.Profile(); pr.enable()
import opsmith
d = os.environ["BENCH_DIR"]
m = opsmith.load_artifact(opsmith.build("myrelu", [os.path.join(d, "relu.cpp"), os.path.join(d, "relu_kernel.cu")]))
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[-5000:])
"""
    out["profile_first_call"] = subprocess.run([sys.executable, "-c", prof], capture_output=True, text=True).stdout
print("RESULT", json.dumps(out))
'''


INLINE = r'''
import json, logging, os, sys, time
import torch
logging.basicConfig(level=logging.INFO, format="@@ %(relativeCreated)d %(message)s")
import opsmith
t0 = time.perf_counter()
art = opsmith.build_inline("relu_ext", os.environ["BENCH_CPP"], cuda_sources=os.environ["BENCH_CU"],
                           functions=["relu"], extra_cuda_cflags=["-O3"])
print("RESULT", json.dumps({"load_s": time.perf_counter() - t0, "built": art.built}))
'''


def child_log(script, env_extra):
    env = dict(os.environ, **env_extra)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    out = {"timeline": [ln[3:][:200] for ln in p.stderr.splitlines() if ln.startswith("@@ ")]}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            out.update(json.loads(line[7:]))
    if "load_s" not in out:
        out["error"] = (p.stdout + p.stderr)[-3000:]
    return out


def child(script, env_extra, argv=()):
    env = dict(os.environ, **env_extra)
    p = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stdout + p.stderr)[-3000:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/opsmith-diag")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = {}

    def save():
        with open(os.path.join(args.out, "diag_cuda_ext.json"), "w") as f:
            json.dump(res, f, indent=1)

    import torch.utils.cpp_extension as ce
    text = open(ce.__file__).read()
    res["torch_std_flags"] = sorted(set(re.findall(r"std[=:]c\+\+\d+", text)))
    res["torch_std_lines"] = [ln.strip() for ln in text.splitlines() if "std=c++" in ln][:12]
    save()
    print("torch std:", res["torch_std_flags"], flush=True)
    base = tempfile.mkdtemp(prefix="opsmith-diag-")
    cache = os.path.join(base, "cache")
    d = project(base, uuid.uuid4().hex)
    t = time.perf_counter()
    res["two_first"] = child(WARM, {"OPSMITH_CACHE_DIR": cache, "BENCH_DIR": d})
    res["two_first"]["wall_s"] = time.perf_counter() - t
    for log in glob.glob(os.path.join(cache, "logs", "*.log")):
        shutil.copy(log, os.path.join(args.out, "build-" + os.path.basename(log)))
        body = open(log, errors="replace").read()
        res.setdefault("invalid_pch_warnings", []).extend(
            ln for ln in body.splitlines() if "invalid-pch" in ln or "not used because" in ln)
    save()
    print("two_first:", json.dumps(res["two_first"])[:300], flush=True)
    res["warm"] = [child(WARM, {"OPSMITH_CACHE_DIR": cache, "BENCH_DIR": d}) for _ in range(5)]
    res["warm_profiled"] = child(WARM, {"OPSMITH_CACHE_DIR": cache, "BENCH_DIR": d, "PROFILE": "1"})
    save()
    for w in res["warm"]:
        print("warm:", {k: round(v, 2) if isinstance(v, float) else v for k, v in w.items()}, flush=True)
    print(res["warm_profiled"].get("profile_first_call", res["warm_profiled"])[:4000], flush=True)
    cu = RELU_CU + f"// {uuid.uuid4().hex}\n"
    res["inline_timeline"] = child_log(INLINE, {"OPSMITH_CACHE_DIR": cache, "BENCH_CU": cu, "BENCH_CPP": RELU_CPP})
    save()
    print("inline:", json.dumps(res["inline_timeline"], indent=0)[:2500], flush=True)
    for std in ("c++17", "c++20"):
        r = child(NVCC_TIME.replace('extra_cuda_cflags=["-O3"]', f'extra_cuda_cflags=["-O3", "-std={std}"]'),
                  {"OPSMITH_CACHE_DIR": cache, "BENCH_CU": cu + f"// {std}\n", "BENCH_CPP": RELU_CPP})
        res[f"nvcc_phases_{std}"] = r
        save()
        print(f"nvcc {std}:", json.dumps(r)[:600], flush=True)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
