#!/usr/bin/env python3
"""The row forwards of 4 chunks a thread (layer_norm_fwd_c4, rms_norm_fwd_c4, softmax's forward on the wide
kernel: ``_launch_norm.norm_c4_plan`` and ``_launch.softmax_plan``) against the plan before them (the
register rows of 2 chunks a thread: both plans patched back), Liger-Kernel and torch.compile(dynamic=False),
kernels alone (torch.profiler, us a call) as GB/s of the bytes-moved floor, beside a copy of the same bytes;
the largest error of ours before and now against float64. Then softmax's backward of 4 chunks a thread
(softmax_bwd_wide at half the threads a row) against its plan now and Liger's backward. Through
opsmith.ops' Python implementations (the C++ ones run the same plans and kernels). Needs a GPU; Liger is
optional (PYTHONPATH to its wheel's files).

    python3 bench/diag_fwd_c4.py [--out FILE.json]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch, _launch_norm, _norms, _sources  # noqa: E402

try:
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
    from liger_kernel.ops.softmax import _softmax_backward, _softmax_forward
except ImportError:
    _softmax_forward = None

SHAPES = [(torch.bfloat16, r, c) for r, c in ((65536, 1024), (16384, 2048), (2048, 2048), (4096, 4096),
                                               (16384, 4096), (2048, 8192), (8192, 8192), (32768, 8192))]
SHAPES += [(torch.float32, r, c) for r, c in ((65536, 1024), (16384, 2048), (8192, 512))]


def _before():
    """Patch the plans back to the register rows of 2 chunks; returns the undo."""
    c4, sm = _launch_norm.norm_c4_plan, _launch.softmax_plan

    def softmax_plan(rows, cols, itemsize, arrays, props):
        p, r = sm(rows, cols, itemsize, arrays, props), _launch.row_plan(rows, cols, itemsize, arrays, props)
        return r if r.strategy == "block" else p

    _launch_norm.norm_c4_plan, _launch.softmax_plan = (lambda *a: None), softmax_plan

    def undo():
        _launch_norm.norm_c4_plan, _launch.softmax_plan = c4, sm
    return undo


def us(fn_):
    return sum(per_kernel(fn_).values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        gb = 2 * rows * cols * x.element_size() / 1e3
        out = torch.empty_like(x)
        copy = gb / us(lambda: out.copy_(x))
        torch._dynamo.reset()
        ops = {
            "layer_norm": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0],
                           lambda: F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5),
                           torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False),
                           (x, w, b), _softmax_forward and (lambda: layer_norm_forward(x, w, b, 1e-5))),
            "rms_norm": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0],
                         lambda: F.rms_norm(x.double(), (cols,), w.double(), 1e-6),
                         torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False), (x, w),
                         _softmax_forward and (lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None))),
            "softmax": (lambda: fn.softmax_cuda(x, -1), lambda: torch.softmax(x.double(), -1),
                        torch.compile(lambda x: torch.softmax(x, -1), dynamic=False), (x,),
                        _softmax_forward and (lambda: _softmax_forward(x))),
        }
        for op, (ours, ref, comp, comp_args, liger) in ops.items():
            want = ref()
            rec = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols, "copy": copy,
                   "now": gb / us(ours), "now_err": (ours().double() - want).abs().max().item()}
            undo = _before()
            try:
                rec["before"] = gb / us(ours)
                rec["before_err"] = (ours().double() - want).abs().max().item()
            finally:
                undo()
            del want
            rec["compile"] = gb / us(lambda: comp(*comp_args))
            if liger:
                rec["liger"] = gb / us(liger)
            print(f"{op:<10} {rec['dtype']:<8} {rows:>6}x{cols:<5} fwd GB/s before {rec['before']:5.0f} -> now "
                  f"{rec['now']:5.0f} ({rec['now'] / rec['before']:4.2f}x) | compile {rec['compile']:5.0f} liger "
                  f"{rec.get('liger', 0):5.0f} copy {copy:5.0f} | err before {rec['before_err']:.1e} now "
                  f"{rec['now_err']:.1e}", flush=True)
            records.append(rec)
        vec = 16 // x.element_size()
        if (cols // vec) % 4 == 0 and 32 <= cols // vec // 4 <= 1024:  # softmax's backward at 4 chunks a thread
            y = fn.softmax_cuda(x, -1)
            g = torch.randn_like(x)
            gb3 = 3 * rows * cols * x.element_size() / 1e3
            tpr = cols // vec // 4
            k = _sources.kernel("softmax.cu", "softmax_bwd_wide<{T}, 4>", str(dt)[6:], 0)
            cfg = _launch.launch_config(_launch.Plan("wide", (rows,), (tpr, 1), 0, 0))
            dx = torch.empty_like(x)
            k.launch(cfg, g, y, dx, rows, cols)
            torch.testing.assert_close(dx, fn.softmax_backward_cuda(g, y, -1))
            rec = {"op": "softmax_bwd", "dtype": str(dt)[6:], "rows": rows, "cols": cols,
                   "now": gb3 / us(lambda: fn.softmax_backward_cuda(g, y, -1)),
                   "c4": gb3 / us(lambda: k.launch(cfg, g, y, dx, rows, cols))}
            if _softmax_forward:
                _, bs, nw, multi = _softmax_forward(x)
                rec["liger"] = gb3 / us(lambda: _softmax_backward(g, y, bs, nw, multi))
            print(f"softmax bwd {rec['dtype']:<8} {rows:>6}x{cols:<5} GB/s now {rec['now']:5.0f} -> 4 chunks "
                  f"{rec['c4']:5.0f} | liger {rec.get('liger', 0):5.0f}", flush=True)
            records.append(rec)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f,
                      indent=1)


if __name__ == "__main__":
    main()
