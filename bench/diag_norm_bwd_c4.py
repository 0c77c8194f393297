#!/usr/bin/env python3
"""The norm backwards of 4 chunks a thread (norm.cu's ``*_bwd_c4``, ``_launch_bwd.norm_bwd_c4_plan``: a row a block,
the weight-gradient sums and the weight in shared memory) against the cluster of 2 blocks a row they replace
(norm_cluster.cu), on the rows between: float 4,097-8,192 columns, and (``--bf16``) 16-bit 8,193-16,384, which the
shipped plan leaves to the clusters. Both through ``opsmith.ops._norms`` (the cluster: the plan made to return None),
the c4 plan asked for every row the float one takes at the same bytes (layer_norm's narrow rows and
``--bf16``'s too), the backward alone (grad, x read; grad_x written: 3 row-sized arrays) and forward + backward (5), GB/s of those bytes,
L2 flushed before each run (``_kernel_timing.median_us``); Liger-Kernel's forward + backward beside them where it is
installed, and each c4 output's largest difference from the cluster's.

    python3 bench/diag_norm_bwd_c4.py --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _kernel_timing import median_us  # noqa: E402
from opsmith.ops import _launch, _launch_bwd, _launch_norm, _norms  # noqa: E402

FLOAT_SHAPES = "8192x8192,32768x8192,65536x8192,16384x6144,16384x5120,4096x8192"
HALF_SHAPES = "4096x16384,8192x12288,16384x10240"


def _liger():
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:
        return None
    return lf


def run_case(op, x, w, b, g, runs):
    """(bwd_us, both_us, outputs) of ``op`` through _norms with the plans as they are set now."""
    cols = x.shape[-1]
    if op == "rms_norm":
        y, rstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)

        def bwd():
            return _norms.rms_norm_bwd(g, x, [cols], rstd, True, w)

        def both():
            y, rstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
            return _norms.rms_norm_bwd(g, x, [cols], rstd, True, w)
    else:
        y, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)

        def bwd():
            return _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w)

        def both():
            y, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
            return _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w)
    outs = bwd()
    return median_us(bwd, runs), median_us(both, runs), outs


def liger_both(lf, op, x, w, b, g, runs):
    xl = x.detach().clone().requires_grad_(True)
    wl = w.detach().clone().requires_grad_(True)
    bl = b.detach().clone().requires_grad_(True)

    def both():
        xl.grad = wl.grad = bl.grad = None
        y = lf.liger_rms_norm(xl, wl, 1e-6) if op == "rms_norm" else lf.liger_layer_norm(xl, wl, bl, 1e-5)
        y.backward(g)
    return median_us(both, runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--float-shapes", default=FLOAT_SHAPES)
    ap.add_argument("--half-shapes", default=HALF_SHAPES)
    ap.add_argument("--bf16", action="store_true", help="also bf16 rows, the c4 plan opened to 2-byte types")
    ap.add_argument("--ops", default="rms_norm,layer_norm")
    args = ap.parse_args()
    shipped = _launch_bwd.norm_bwd_c4_plan
    lf = _liger()
    cases = [(torch.float32, s) for s in args.float_shapes.split(",")]
    if args.bf16:
        cases += [(torch.bfloat16, s) for s in args.half_shapes.split(",")]
    rows_out = []
    for dtype, shape in cases:
        rows, cols = map(int, shape.split("x"))
        torch.manual_seed(0)
        x = torch.randn(rows, cols, device="cuda", dtype=dtype)
        g = torch.randn_like(x)
        w, b = torch.randn(cols, device="cuda", dtype=dtype), torch.randn(cols, device="cuda", dtype=dtype)
        for op in args.ops.split(","):
            res = {}
            for name in ("c4", "cluster"):
                if name == "c4":  # 16-bit rows as float's of the same bytes (--bf16), layer_norm's narrow rows too
                    def plan(r, c, i, p, a=2, _s=shipped):
                        got = _s(r, c * i // 4, 4, p, 1) if c * i % 4 == 0 else None
                        return got if got is None else got._replace(
                            shared_mem=(a * (16 // i) * 4 + 16) * _launch.BWD_C4_CHUNKS * _launch.ROW_THREADS)
                else:
                    def plan(*a, **k):
                        return None
                _norms._launch_bwd.norm_bwd_c4_plan = plan
                try:
                    res[name] = run_case(op, x, w, b, g, args.runs)
                finally:
                    _norms._launch_bwd.norm_bwd_c4_plan = shipped
            diff = max(float((a.float() - c.float()).abs().max() / max(1.0, float(c.float().abs().max())))
                       for a, c in zip(res["c4"][2], res["cluster"][2]))
            n = x.nbytes
            row = {"op": op, "dtype": str(dtype).replace("torch.", ""), "shape": [rows, cols],
                   "max_rel_diff": diff}
            line = f"{op:<10} {row['dtype']:<8} {rows:>6}x{cols:<6}"
            for name, (bu, fu, _) in res.items():
                row[name] = {"bwd_us": bu, "both_us": fu, "bwd_gbps": 3 * n / bu / 1e3, "both_gbps": 5 * n / fu / 1e3}
                line += f" | {name}: bwd {3 * n / bu / 1e3:5.0f} both {5 * n / fu / 1e3:5.0f}"
            line += f" | c4/cluster bwd {res['cluster'][0] / res['c4'][0]:.3f}x both {res['cluster'][1] / res['c4'][1]:.3f}x"
            if lf is not None:
                lu = liger_both(lf, op, x, w, b, g, args.runs)
                row["liger_both_us"] = lu
                line += f" | liger both {5 * n / lu / 1e3:5.0f} (c4 {lu / res['c4'][1]:.3f}x)"
            line += f" d={diff:.2g}"
            rows_out.append(row)
            print(line, flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "command": "python3 bench/diag_norm_bwd_c4.py " + " ".join(sys.argv[1:]),
                                     "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
