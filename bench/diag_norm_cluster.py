#!/usr/bin/env python3
"""The rows too long for one block's registers: the thread-block cluster kernels (norm_cluster.cu,
softmax_cluster.cu; sm_90+), for each CLUSTER_THREADS of ``--threads``, against the kernels they
replace (norm_long.cu's; softmax's wide or long ones), in one process.

Both run through the Python implementations (``opsmith.ops._norms``, ``_functional``: the same plans
the C++ library ports); "long" is the device's properties with ``clusters=False``. Forward, and forward +
backward (the weight gradient included), GB/s of the bytes-moved floor and the ratio to "long", L2
flushed before each run (``_kernel_timing.median_us``), and each output's largest difference from
"long"'s.

    python3 bench/diag_norm_cluster.py --json OUT.json
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
from opsmith.ops import _functional, _launch, _launch_norm, _norms  # noqa: E402

SHAPES = "2048x32768,4096x16384,1024x65536,8192x12288,16384x8200,8192x8192,16384x6144"


def cases(op, x, w, b, g):
    cols = x.shape[-1]
    if op == "softmax":
        def fwd():
            return (_functional.softmax_fwd(x),)

        def both():
            (y,) = fwd()
            return (y, _functional.softmax_bwd(g, y))
        return fwd, both
    if op == "rms_norm":
        def fwd():
            return _norms.rms_norm_fwd(x, [cols], w, 1e-6)

        def both():
            y, rstd = fwd()
            return (y,) + _norms.rms_norm_bwd(g, x, [cols], rstd, True, w)
        return fwd, both
    def fwd():
        return _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)

    def both():
        y, mean, rstd = fwd()
        return (y,) + _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w)
    return fwd, both


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--threads", default="256", help="CLUSTER_THREADS values to try (comma-separated)")
    ap.add_argument("--shapes", default=SHAPES, help="ROWSxCOLS,... (default: %(default)s)")
    ap.add_argument("--ops", default="rms_norm,layer_norm", help="of rms_norm, layer_norm, softmax")
    ap.add_argument("--softmax-fwd-2chunks", action="store_true",
                    help="the cluster variants run softmax's forward on clusters of 2 chunks a thread too "
                         "(where the plan keeps the wide kernel)")
    args = ap.parse_args()
    dev = torch.cuda.current_device()
    real = _launch.device_props(dev)
    variants = {f"cluster{t}": (real, t) for t in args.threads.split(",")}
    variants["long"] = (real._replace(clusters=False), _launch.CLUSTER_THREADS)
    shipped = _launch.softmax_plan
    if args.softmax_fwd_2chunks:
        def forced(rows, cols, itemsize, arrays, p):
            plan = shipped(rows, cols, itemsize, arrays, p)
            if p.clusters and arrays == 1 and itemsize == 2 and plan.strategy == "wide" and \
                    -(-cols // (_launch.ROW_CHUNKS * 8)) <= 2 * _launch.ROW_THREADS:
                return _launch._cluster(rows, cols, itemsize, p, 2, _launch.ROW_CHUNKS, _launch.CLUSTER_FWD_BLOCKS, rows)
            return plan
        _launch.softmax_plan = forced
    rows_out = []
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for rows, cols in (tuple(map(int, sh.split("x"))) for sh in args.shapes.split(",")):
            if dtype == torch.float32 and cols > 32768:
                continue
            torch.manual_seed(0)
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            g = torch.randn_like(x)
            w, b = torch.randn(cols, device="cuda", dtype=dtype), torch.randn(cols, device="cuda", dtype=dtype)
            item = x.element_size()
            for op in args.ops.split(","):
                res, outs, plans = {}, {}, {}
                for name, (p, threads) in variants.items():
                    _launch.device_props = lambda d, p=p: p  # noqa: E731  (the plans read it per call)
                    _launch.CLUSTER_THREADS = _launch_norm.CLUSTER_THREADS = int(threads)  # norm_cluster_plan's
                    _launch_norm.norm_cluster_plan.cache_clear()
                    plan = _launch.softmax_plan(rows, cols, item, 1, p) if op == "softmax" else \
                        _launch_norm.norm_cluster_plan(rows, cols, item, p, False)
                    plan = plan if plan is not None and plan.strategy == "cluster" else None
                    plans[name] = (plan.cluster, plan.chunks, plan.block[0], plan.grid[0]) if plan else None
                    fwd, both = cases(op, x, w, b, g)
                    outs[name] = both()
                    res[name] = (median_us(fwd, args.runs), median_us(both, args.runs))
                fwd_bytes, both_bytes = 2 * x.nbytes, 5 * x.nbytes  # x, y; + grad, x again, dx
                row = {"op": op, "dtype": str(dtype).replace("torch.", ""), "shape": [rows, cols], "plans": plans}
                line = f"{op:<10} {row['dtype']:<8} {rows:>6}x{cols:<6}"
                lf, lb = res["long"]
                for name, (f, fb) in res.items():
                    diff = max(float((a.float() - c.float()).abs().max()) for a, c in zip(outs[name], outs["long"])
                               if a.numel())
                    row[name] = {"fwd_us": f, "both_us": fb, "fwd_gbps": fwd_bytes / f / 1e3,
                                 "both_gbps": both_bytes / fb / 1e3, "max_abs_diff_from_long": diff}
                    line += (f" | {name} {plans[name]}: fwd {fwd_bytes / f / 1e3:5.0f} ({lf / f:.2f}x) "
                             f"both {both_bytes / fb / 1e3:5.0f} ({lb / fb:.2f}x) d={diff:.2g}")
                rows_out.append(row)
                print(line, flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "command": "python3 bench/diag_norm_cluster.py " + " ".join(sys.argv[1:]),
                                     "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
