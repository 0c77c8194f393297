"""Where the tutorial's two-file cold build spends its time (a diagnostic, not a benchmark).

    python bench/diag_two_file.py --out DIR

1. A fresh cache; the precompiled torch header built first (as ``opsmith warm`` does).
2. The two-file project built cold under cProfile: opsmith's own step timings (from ninja's
   log) and the Python functions that took the rest.
3. The exact ``relu.cpp`` command opsmith ran, re-run by hand with variants (``-fsyntax-only``,
   ``-ftime-report``, ``-flto`` with a parallel link), and the ``.cu`` and link steps alone.

Prints one line per measurement and writes ``DIR/diag_two_file.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "tutorial_relu")

COLD = r'''
import cProfile, io, json, os, pstats, sys, time
import torch
srcs = [os.path.join(os.environ["D"], f) for f in ("relu.cpp", "relu_kernel.cu")]
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
import opsmith
art = opsmith.build("myrelu", srcs, verbose=False)
t1 = time.perf_counter()
m = opsmith.load_artifact(art)
pr.disable()
t2 = time.perf_counter()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30)
print(s.getvalue()[-6000:])
print("RESULT", json.dumps({"build_call_s": t1 - t0, "load_artifact_s": t2 - t1, "inside_build_s": art.seconds,
                            "steps": art.steps}))
'''


def sh(cmd, **kw):
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return time.perf_counter() - t, p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=tempfile.mkdtemp())
    ap.add_argument("--alternate", type=int, default=0,
                    help="only alternate N times: an opsmith cold build, then its relu.cpp command by hand")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = {}

    def rec(k, v):
        res[k] = v
        print(f"{k}: {json.dumps(v)[:600]}", flush=True)
        with open(os.path.join(args.out, "diag_two_file.json"), "w") as f:
            json.dump(res, f, indent=1)

    base = tempfile.mkdtemp(prefix="opsmith-diag-")
    cache = os.path.join(base, "cache")
    env = dict(os.environ, OPSMITH_CACHE_DIR=cache, OPSMITH_PCH_WAIT="1", OPSMITH_LOG_LEVEL="info")

    def project():
        d = os.path.join(base, uuid.uuid4().hex[:8])
        shutil.copytree(EXAMPLE, d)
        for n in ("relu.cpp", "relu_kernel.cu"):
            with open(os.path.join(d, n), "a") as f:
                f.write(f"\n// {uuid.uuid4().hex}\n")
        return d

    # 1. the PCH, waited for (first build)
    t, p = sh([sys.executable, "-c", COLD], env=dict(env, D=project()))
    rec("first_build_with_pch_wait_s", round(t, 2))
    if args.alternate:
        alternate(args.alternate, env, project, rec)
        return
    # 2. cold, PCH present, twice
    for i in range(2):
        t, p = sh([sys.executable, "-c", COLD], env=dict(env, D=project()))
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        rec(f"cold_{i}", {"process_s": round(t, 2), **(json.loads(line[0][7:]) if line else {"err": p.stderr[-3000:]})})
        if i == 0:
            with open(os.path.join(args.out, "cold_profile.txt"), "w") as f:
                f.write(p.stdout + "\n---- stderr\n" + p.stderr)
    # 3. the commands themselves
    sys.path.insert(0, ROOT)
    os.environ.update(OPSMITH_CACHE_DIR=cache)
    from opsmith._build import _pch
    from opsmith._build._engine import _cxx_flags, _Toolchain, _plan, _ldflags
    from opsmith._spec import ExtensionSpec
    from opsmith._cache._open import open_store
    d = project()
    spec = ExtensionSpec.from_files("myrelu", [os.path.join(d, "relu.cpp"), os.path.join(d, "relu_kernel.cu")],
                                    kind="module")
    store = open_store(None)
    tc = _Toolchain(store, spec)
    units = _plan(spec, tc)
    pch = _pch.ensure_pch(store, tc.cxx, tc.torch, _cxx_flags(spec, tc), wait=True)
    w = tempfile.mkdtemp()
    cxx = [u for u in units if u.rule == "cxx"][0]
    cu = [u for u in units if u.rule == "nvcc"][0]
    base_cmd = [cxx.compiler, *pch.use_flags, *cxx.flags, "-c", cxx.source.path]
    rec("cxx_command", base_cmd)
    for name, extra in [("cxx_c", ["-o", f"{w}/a.o"]), ("cxx_c_again", ["-o", f"{w}/a.o"]),
                        ("cxx_syntax_only", ["-fsyntax-only"]),
                        ("cxx_flto", ["-flto", "-o", f"{w}/lto.o"]),
                        ("cxx_fno_implicit_templates", ["-fno-implicit-templates", "-o", f"{w}/nit.o"]),
                        ("cxx_ggc", ["--param", "ggc-min-expand=400", "--param", "ggc-min-heapsize=2000000",
                                     "-o", f"{w}/g.o"]),
                        ("cxx_time_report", ["-ftime-report", "-o", f"{w}/tr.o"])]:
        t, p = sh(["/usr/bin/time", "-f", "TIME %e %U %S %M", *base_cmd, *extra])
        tl = [ln for ln in p.stderr.splitlines() if ln.startswith("TIME ")]
        v = {"s": round(t, 3), "rc": p.returncode, "time": tl[-1] if tl else None}
        if name == "cxx_time_report":
            v["report"] = [ln for ln in p.stderr.splitlines() if "%" in ln][:60]
        elif p.returncode:
            v["err"] = p.stderr[-800:]
        rec(name, v)
    t, p = sh([cu.compiler, *cu.flags, "-c", cu.source.path, "-o", f"{w}/k.o"])
    rec("nvcc_kernel", {"s": round(t, 3), "rc": p.returncode, "cmd": [cu.compiler, *cu.flags]})
    ld = _ldflags(spec, tc)
    t, p = sh([tc.cxx.path, f"{w}/a.o", f"{w}/k.o", *ld, "-o", f"{w}/m.so"])
    rec("link", {"s": round(t, 3), "rc": p.returncode, "cmd": ld})
    for jobs in ("auto", "4", "16"):
        t, p = sh([tc.cxx.path, f"-flto={jobs}", f"{w}/lto.o", f"{w}/k.o", *ld, "-o", f"{w}/mlto.so"])
        rec(f"link_flto_{jobs}", {"s": round(t, 3), "rc": p.returncode, "err": p.stderr[-500:]})
    t, p = sh(["sh", "-c", "gcc --version | head -1; cat /sys/kernel/mm/transparent_hugepage/enabled; "
               "ls $(gcc -print-file-name=plugin)/include 2>&1 | head -3; lscpu | grep 'Model name'"])
    rec("machine", p.stdout)


def alternate(n, env, project, rec):
    """Is relu.cpp slower inside opsmith's ninja run than by hand? The same command, interleaved."""
    import shlex
    for i in range(n):
        d = project()
        t, p = sh([sys.executable, "-c", COLD], env=dict(env, D=d))
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        r = json.loads(line[0][7:]) if line else {"err": p.stderr[-2000:]}
        rec(f"alt_{i}_opsmith", {"process_s": round(t, 2), "steps": r.get("steps")})
        cmd = None  # the build's info line for the step carries its command
        for ln in p.stderr.splitlines():
            if "compile " in ln and "relu.cpp: " in ln:
                cmd = ln.split("relu.cpp: ", 1)[1]
        if not cmd:
            rec(f"alt_{i}_hand", {"err": "command not found"})
            continue
        argv = shlex.split(cmd)
        argv[argv.index("-o") + 1] = "/tmp/diag_alt.o"
        if "-MF" in argv:
            argv[argv.index("-MF") + 1] = "/tmp/diag_alt.o.d"
        t, p = sh(argv)
        rec(f"alt_{i}_hand", {"s": round(t, 3), "rc": p.returncode, "err": p.stderr[-300:]})


if __name__ == "__main__":
    main()
