#!/usr/bin/env python3
"""The small norm backwards (bf16, 64 to 1,024 rows of 512 to 1,024) under other plans, through opsmith.ops'
Python implementations (the plans patched in-process): as shipped; "split" (norm_split.cu's grad_x kernel,
a row a row lane, then norm_bwd_weight as weight_grad_plan says); "split+cluster" (the same with
norm_bwd_weight_cluster: 8 chunks of rows a column block, straight to the gradients, one launch), beside torch
eager's backward kernels (the same autograd.grad as bench_ops.py). Kernels alone (torch.profiler, us a call,
their sum) and GPU time with the L2 flushed (opsmith.ops.benchmark); every variant's gradients checked against
the shipped ones. Needs a GPU.

    python3 bench/diag_small_bwd_plans.py [--json FILE]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from _kernel_timing import write_records  # noqa: E402  (bench/, this script's folder)
from diag_norm_split import per_kernel  # noqa: E402
from opsmith import ops  # noqa: E402
from opsmith.ops import _launch, _launch_bwd, _norms  # noqa: E402

SHAPES = [(64, 512), (64, 1024), (256, 1024), (256, 512), (1024, 512), (1024, 1024)]
BWD, WG = _launch_bwd.norm_bwd_plan, _launch_bwd.weight_grad_plan


def patch(variant):
    _launch_bwd.norm_bwd_plan, _launch_bwd.weight_grad_plan = BWD, WG
    if variant == "shipped":
        return

    def bwd(rows, cols, itemsize, props, arrays=2):
        p = BWD(rows, cols, itemsize, props, arrays)
        if p.strategy not in ("persistent", "split"):
            return p
        tpr, per_block = p.block
        return _launch.Plan("split", (-(-rows // per_block),), (tpr, per_block), 0, 0)

    def wg(rows, cols, itemsize, props):
        if variant != "split+cluster" or rows <= 16:
            return WG(rows, cols, itemsize, props)
        col_blocks = -(-cols // (32 * (16 // itemsize)))
        k = _launch.WEIGHT_CLUSTER
        return _launch.Plan("cluster", (k, col_blocks), (32, 8), 0, 0, k), -(-rows // k)
    _launch_bwd.norm_bwd_plan, _launch_bwd.weight_grad_plan = bwd, wg


def norm_bwd_cases(rows: int, cols: int, dtype):
    """(x, {op: (ours, eager)}): layer_norm's and rms_norm's backward of random rows through opsmith.ops'
    Python implementations (the plans as patched when called) and torch eager's autograd.grad over a graph built
    once (as bench_ops.py); diag_small_bwd_one.py uses them too."""
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    w, b = torch.randn(cols, device="cuda", dtype=dtype), torch.randn(cols, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    _, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
    _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

    def eager(y, leaves):
        return lambda: torch.autograd.grad(y, leaves, g, retain_graph=True)
    return x, {
        "layer_norm": (lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w),
                       eager(F.layer_norm(xg, (cols,), wg, bg, 1e-5), (xg, wg, bg))),
        "rms_norm": (lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w),
                     eager(F.rms_norm(xg, (cols,), wg, 1e-6), (xg, wg))),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    records = []
    for rows, cols in SHAPES:
        x, cases = norm_bwd_cases(rows, cols, torch.bfloat16)
        for op, (ours, eager) in cases.items():
            out = {}
            for variant in ("shipped", "split", "split+cluster", "eager"):
                f = eager if variant == "eager" else ours
                patch(variant if variant != "eager" else "shipped")
                try:
                    got = f()
                    if variant == "shipped":
                        want = got
                    elif variant != "eager":
                        for a, e in zip(got, want):
                            torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)
                    ks = per_kernel(f)
                    us = ops.benchmark(f, bytes_moved=3 * x.numel() * 2).median_ms * 1e3
                finally:
                    patch("shipped")
                out[variant] = {"event_us": us, "kernels_us": ks}
            records.append({"op": op, "rows": rows, "cols": cols, "variants": out})
            print(f"{op:<10} {rows:>5}x{cols:<5} " + " | ".join(
                f"{v} {r['event_us']:6.2f} ({sum(r['kernels_us'].values()):5.2f} in {len(r['kernels_us'])})"
                for v, r in out.items()), flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
