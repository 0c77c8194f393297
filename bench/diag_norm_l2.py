#!/usr/bin/env python3
"""The norm forwards on rows of 16 KiB or more: norm_l2.cu's two passes over a row held in L2
(``_launch_norm.norm_l2_plan``, the plan now) against the plan before it (the register rows, the clusters,
layer_norm_fwd4 or the long rows: norm_l2_plan forced to None) and torch.compile(dynamic=False), kernels
alone (torch.profiler, us a call), as GB/s of the bytes-moved floor; and the largest error of each
against float64. add_rms_norm too (compile: y and the new residual, as the peers benchmark). Through opsmith.ops._norms (the Python implementations; the C++ ones run the same
plans and kernels, tests/ops/test_ops_native_gpu.py). Needs a GPU.

    python3 bench/diag_norm_l2.py [--out FILE.json]

(bench/results/ops-norm-l2-h200-2026-11-26/variants.* hold the launch-variant sweep that chose the
plan's 2 chunks a trip, 32 registers and about 4 chunks a thread.)
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _fused, _launch, _launch_norm, _norms  # noqa: E402

SHAPES = [(torch.bfloat16, r, c) for r, c in ((4096, 4096), (16384, 4096), (8192, 8192), (2048, 8192), (4096, 16384),
                                               (8192, 12288), (2048, 32768), (1024, 65536), (512, 131072),
                                               (128, 262144))]
SHAPES += [(torch.float32, r, c) for r, c in ((16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768))]
SHAPES += [(torch.float16, r, c) for r, c in ((8192, 8192), (4096, 16384))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    orig = _launch_norm.norm_l2_plan
    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        torch._dynamo.reset()
        ln_c = torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False)
        rms_c = torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)
        add_c = torch.compile(lambda x, r, w: (F.rms_norm(x + r, (cols,), w, 1e-6), x + r), dynamic=False)
        res = torch.randn_like(x)
        rec = {"dtype": str(dt)[6:], "rows": rows, "cols": cols,
               "l2_plan": (lambda p: p and {"grid": p.grid, "block": p.block})(orig(rows, cols, x.element_size(),
                                                                                  _launch.device_props(0)))}
        with torch.no_grad():
            for op, ours, comp, ref in (
                    ("layer_norm", lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0], lambda: ln_c(x, w, b),
                     lambda: F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)),
                    ("rms_norm", lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0], lambda: rms_c(x, w),
                     lambda: F.rms_norm(x.double(), (cols,), w.double(), 1e-6)),
                    ("add_rms_norm", lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6)[0],
                     lambda: add_c(x, res, w),
                     lambda: F.rms_norm((x + res).double(), (cols,), w.double(), 1e-6))):
                want = ref()
                now, now_err = sum(per_kernel(ours).values()), (ours().double() - want).abs().max().item()
                _launch_norm.norm_l2_plan = lambda *a: None  # the plan before
                try:
                    before, before_err = sum(per_kernel(ours).values()), (ours().double() - want).abs().max().item()
                finally:
                    _launch_norm.norm_l2_plan = orig
                del want
                comp_us = sum(per_kernel(comp).values())
                gb = (4 if op == "add_rms_norm" else 2) * rows * cols * x.element_size() / 1e3  # x (and residual) read,
                # y (and the new residual) written
                rec[op] = {"now_us": now, "before_us": before, "compile_us": comp_us, "now_err": now_err,
                           "before_err": before_err}
                print(f"{rec['dtype']:<9} {rows:>6}x{cols:<7} {op:<10} GB/s before {gb / before:5.0f} -> now "
                      f"{gb / now:5.0f} ({before / now:4.2f}x) | compile {gb / comp_us:5.0f} (ours {comp_us / now:4.2f}x)"
                      f" | max err before {before_err:.1e} now {now_err:.1e}", flush=True)
        records.append(rec)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f,
                      indent=1)


if __name__ == "__main__":
    main()
