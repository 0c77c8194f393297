#!/usr/bin/env python3
"""softmax's backward, kernels alone (torch.profiler, us a call), as GB/s of the bytes-moved floor (grad_y
and y read, grad_x written): the plan's kernel (``_launch.softmax_plan``), the one-block register rows
(``"wide"``) forced where the plan takes clusters, Liger-Kernel's backward when it imports, and eager
torch. Needs a GPU (and Liger-Kernel on the path for its column).

    PYTHONPATH=/tmp/liger python3 bench/diag_softmax_bwd.py [--out FILE.json]
"""
import argparse
import json
import sys

import torch

sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch  # noqa: E402

SHAPES = [(torch.bfloat16, r, c) for r, c in ((4096, 4096), (16384, 4096), (8192, 8192), (2048, 16384),
                                               (4096, 16384), (8192, 12288), (2048, 32768), (65536, 1024))]
SHAPES += [(torch.float32, r, c) for r, c in ((4096, 8192), (2048, 16384))]


def _wide(rows, cols, itemsize):
    vec = 16 // itemsize
    tpr = _launch._pow2_at_least(-(-cols // (_launch.WIDE_CHUNKS * vec)))
    return _launch.Plan("wide", (rows,), (tpr, 1), 0, 0) if tpr <= _launch.LONG_THREADS else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    try:
        from liger_kernel.ops.softmax import _softmax_backward
        from liger_kernel.ops.utils import calculate_settings
    except ImportError:
        _softmax_backward = None
    orig = _launch.softmax_plan
    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt)
        y = torch.softmax(x.float(), -1).to(dt)
        g = torch.randn_like(y)
        gb = 3 * rows * cols * y.element_size() / 1e3
        plan = orig(rows, cols, y.element_size(), 2, _launch.device_props(0))
        rec = {"dtype": str(dt)[6:], "rows": rows, "cols": cols, "plan": plan.strategy,
               "plan_us": sum(per_kernel(lambda: fn.softmax_bwd(g, y)).values())}
        wide = _wide(rows, cols, y.element_size())
        if plan.strategy != "wide" and wide is not None:
            _launch.softmax_plan = lambda *a: wide
            try:
                rec["wide_us"] = sum(per_kernel(lambda: fn.softmax_bwd(g, y)).values())
                got = fn.softmax_bwd(g, y)
            finally:
                _launch.softmax_plan = orig
            want = fn.softmax_bwd(g, y)
            rec["wide_vs_plan_max_diff"] = (got.float() - want.float()).abs().max().item()
        if _softmax_backward is not None:
            bs, warps = calculate_settings(cols)
            rec["liger_us"] = sum(per_kernel(lambda: _softmax_backward(g, y, bs, warps, False)).values())
        rec["eager_us"] = sum(per_kernel(lambda: torch._softmax_backward_data(g, y, -1, dt)).values())
        records.append(rec)
        print(f"{rec['dtype']:<9} {rows:>6}x{cols:<6} GB/s: plan ({plan.strategy}) {gb / rec['plan_us']:5.0f}"
              + (f" | wide {gb / rec['wide_us']:5.0f}" if "wide_us" in rec else "")
              + (f" | liger {gb / rec['liger_us']:5.0f}" if "liger_us" in rec else "")
              + f" | eager {gb / rec['eager_us']:5.0f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f,
                      indent=1)


if __name__ == "__main__":
    main()
