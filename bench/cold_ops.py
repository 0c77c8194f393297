#!/usr/bin/env python3
"""Cold compile time of every opsmith.ops program (12 programs, 84 kernels) for one arch:
one at a time against all at once (opsmith.compile_many), each in a fresh process and cache.
Needs NVRTC, no GPU.

    python3 bench/cold_ops.py --arch sm_90 [--repeat 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ONE = """
import sys, time
from opsmith._build import _nvrtc
from opsmith.ops import _sources
_nvrtc.nvrtc_version()  # the library load (once per process) is not part of the compile
t = time.perf_counter()
_sources.warm(sys.argv[1], max_workers=1 if sys.argv[2] == "serial" else None, progress=False)
print(time.perf_counter() - t, _nvrtc.nvrtc_stats["compiles"])
"""


def run(arch: str, mode: str) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "OPSMITH_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", ONE, arch, mode], env=env, capture_output=True, text=True,
                             check=True)
        seconds, compiles = out.stdout.split()
        if int(compiles) != 12:
            raise SystemExit(f"expected 12 NVRTC compiles, got {compiles}")
        return float(seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    res: dict[str, list[float]] = {"serial": [], "concurrent": []}
    for _ in range(args.repeat):  # alternate, so that load on the machine hits both alike
        for mode in res:
            res[mode].append(run(args.arch, mode))
    cpus = os.cpu_count()
    s, c = min(res["serial"]), min(res["concurrent"])
    line = (f"opsmith.ops cold compile for {args.arch} on {cpus} CPUs: one at a time {s:.1f} s, all at once "
            f"{c:.1f} s ({s / c:.1f}x); every run: {res}")
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": args.arch, "cpus": cpus, "seconds": res, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
