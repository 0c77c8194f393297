"""export-c: the host cost of a launch through the generated function against a bare cuLaunchKernel
(both from C; target: at most 0.3 us more), and the export of 100 kernels cold (time, library size).

    python3 bench/bench_export_c_launch.py [--out results.json] [--skip-launch]

The launch part needs a GPU; the export part runs anywhere. Prints ours and the anchor side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def launch_cost(work: Path) -> dict:
    import opsmith
    ex = REPO / "examples" / "export_c"
    res = opsmith.export_c(ex / "kernels.cu", ["relu", "axpy_f=axpy<float>", "empty"], out_dir=work, prefix="ex")
    from opsmith._runtime import _driver
    arch = _driver.device_arch(0)
    cubin = opsmith.compile_cuda(ex / "kernels.cu", arch=arch)
    (work / "empty.cubin").write_bytes(cubin.code)
    exe = work / "launch_bench"
    subprocess.run(["gcc", "-std=c99", "-O2", "-c", str(res.source), "-o", str(work / "ex.o")], check=True)
    subprocess.run(["gcc", "-std=c99", "-O2", f"-I{work}", str(REPO / "bench" / "export_c_launch.c"),
                    str(work / "ex.o"), "-o", str(exe), "-ldl", "-lpthread"], check=True)
    out = subprocess.run([str(exe), str(work / "empty.cubin")], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"launch bench failed: {out.stderr}")
    return {**json.loads(out.stdout), "arch": arch}


def export_100(work: Path) -> dict:
    src = "\n".join(f'extern "C" __global__ void k{i}(const float* x, float* y, long long n) {{ long long j = '
                    f'blockIdx.x * (long long)blockDim.x + threadIdx.x; if (j < n) y[j] = x[j] * {i}.0f + {i}; }}'
                    for i in range(100))
    (work / "k100.cu").write_text(src)
    env = {**os.environ, "OPSMITH_CACHE_DIR": str(work / "cold-cache")}  # cold: a new cache
    code = ("import json, sys, time, opsmith; t = time.perf_counter(); "
            f"r = opsmith.export_c({str(work / 'k100.cu')!r}, out_dir={str(work / 'o100')!r}, library='both'); "
            "print(json.dumps({'seconds': time.perf_counter() - t, 'steps': r.seconds, 'archs': r.archs, "
            "'shared_library': str(r.shared_library), 'source': str(r.source)}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["shared_library_bytes"] = os.path.getsize(data.pop("shared_library"))
    data["source_bytes"] = os.path.getsize(data.pop("source"))
    data["cores"] = len(os.sched_getaffinity(0))
    return data


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--skip-launch", action="store_true", help="only the export part (no GPU needed)")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="osm-exportc-bench-") as tmp:
        work = Path(tmp)
        results["export_100"] = export_100(work)
        if not args.skip_launch:
            results["launch"] = launch_cost(work)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    e = results["export_100"]
    print(f"export of 100 kernels, cold ({e['cores']} cores, {len(e['archs'])} targets): {e['seconds']:.2f} s "
          f"(compile {e['steps']['compile']:.2f}, generate+write {e['steps']['generate'] + e['steps']['write']:.2f}, "
          f"library {e['steps']['library']:.2f}); lib .so {e['shared_library_bytes'] / 1e6:.2f} MB, "
          f".c {e['source_bytes'] / 1e6:.2f} MB")
    if "launch" in results:
        r = results["launch"]
        print(f"launch host cost ({r['arch']}): ours {r['ours_us']:.3f} us | bare cuLaunchKernel {r['bare_us']:.3f} us "
              f"| extra {r['extra_us']:+.3f} us | ratio {r['ratio']:.3f} (target: extra <= 0.3 us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
