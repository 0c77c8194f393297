#!/usr/bin/env python3
"""The norm forwards in two passes over a row held in L2 (norm_l2.cu) against the plan's kernels and
torch.compile(dynamic=False), kernels alone (torch.profiler, us a call), over launch variants: threads
a block, U chunks a thread a trip, R (minimum blocks of 1,024 threads an SM: 2 caps registers at 32)
and H (L2 eviction hints on or off). Prints GB/s of the bytes-moved floor and the error against
float64. Needs a GPU.

    python3 bench/diag_norm_l2.py [--out FILE.json] [--quick]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402  (bench/, this script's folder)
import opsmith.ops as ops  # noqa: E402
from opsmith._runtime._launch_config import LaunchConfig  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops._sources import DTYPES, KERNEL_DIR  # noqa: E402

VARIANTS = [(512, 1, 2, 1), (512, 2, 2, 1), (512, 4, 2, 1), (512, 2, 1, 1), (512, 1, 2, 0), (256, 2, 2, 1),
            (1024, 2, 2, 1), (1024, 1, 2, 1), (256, 4, 2, 1)]  # threads, U, R, H
SHAPES = [(torch.bfloat16, r, c) for r, c in ((4096, 4096), (16384, 4096), (8192, 8192), (4096, 16384),
                                               (2048, 32768), (8192, 12288), (1024, 65536), (512, 131072),
                                               (65536, 1024), (2048, 8192))]
SHAPES += [(torch.float32, r, c) for r, c in ((8192, 8192), (4096, 16384), (2048, 32768), (16384, 4096))]
SHAPES += [(torch.float16, 4096, 16384)]


def pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    arch = _driver.device_arch(0)
    names = {}
    for dt in {s[0] for s in SHAPES}:
        t, a = DTYPES[str(dt)[6:]]
        names[dt] = [f"{op}_fwd_l2<{u}, {r}, {h}, {t}, {a}>" for op in ("layer_norm", "rms_norm")
                     for _, u, r, h in VARIANTS]
    mods = {dt: CudaModule(KERNEL_DIR / "norm_l2.cu", name_expressions=sorted(set(n)), arch=arch, name="diag_l2")
            for dt, n in names.items()}
    records = []
    for dt, rows, cols in SHAPES[:3] if args.quick else SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w = torch.randn(cols, device="cuda", dtype=dt)
        b = torch.randn(cols, device="cuda", dtype=dt)
        t, a = DTYPES[str(dt)[6:]]
        n = 16 // x.element_size()
        gb = 2 * rows * cols * x.element_size() / 1e3  # bytes / 1e3: GB/s from us
        ref_ln = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
        ref_rms = F.rms_norm(x.double(), (cols,), w.double(), 1e-6)
        torch._dynamo.reset()
        ln_c = torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False)
        rms_c = torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)
        rec = {"dtype": str(dt)[6:], "rows": rows, "cols": cols}
        with torch.no_grad():
            for op, ours, comp, ref in (
                    ("layer_norm", lambda: ops.layer_norm(x, (cols,), w, b), lambda: ln_c(x, w, b), ref_ln),
                    ("rms_norm", lambda: ops.rms_norm(x, (cols,), w, 1e-6), lambda: rms_c(x, w), ref_rms)):
                res = {"plan": sum(per_kernel(ours).values()), "compile": sum(per_kernel(comp).values()),
                       "plan_err": (ours().double() - ref).abs().max().item()}
                for threads, u, r, h in VARIANTS:
                    nv = cols // n
                    tpb = max(32, min(threads, pow2_at_least(-(-nv // u))))
                    k = mods[dt].get_kernel(f"{op}_fwd_l2<{u}, {r}, {h}, {t}, {a}>")
                    y = torch.empty_like(x)
                    st = torch.empty(rows, device="cuda", dtype=torch.float64 if dt == torch.float64 else torch.float32)
                    st2 = torch.empty_like(st)
                    cfg = LaunchConfig((rows,), (tpb,), 0)
                    if op == "layer_norm":
                        fn = lambda: k.launch(cfg, x, w, b, y, st, st2, rows, cols, 1e-5, 1, 1)  # noqa: E731
                    else:
                        fn = lambda: k.launch(cfg, x, w, y, st, rows, cols, 1e-6, 1)  # noqa: E731
                    us = sum(per_kernel(fn).values())
                    fn()
                    torch.cuda.synchronize()
                    res[f"l2 {threads}/{u}/{r}/{h}"] = us
                    res[f"err {threads}/{u}/{r}/{h}"] = (y.double() - ref).abs().max().item()
                rec[op] = res
                best = min((v, kk) for kk, v in res.items() if kk.startswith("l2 "))
                print(f"{rec['dtype']:<9} {rows}x{cols:<7} {op:<10} plan {gb / res['plan']:5.0f} GB/s  compile "
                      f"{gb / res['compile']:5.0f}  best l2 {gb / best[0]:5.0f} ({best[1][3:]}) | "
                      + " ".join(f"{kk[3:]}:{gb / v:.0f}" for kk, v in res.items() if kk.startswith("l2 "))
                      + f" | err plan {res['plan_err']:.1e} l2 {res['err ' + best[1][3:]]:.1e}", flush=True)
        records.append(rec)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f,
                      indent=1)


if __name__ == "__main__":
    main()
