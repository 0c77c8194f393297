#!/usr/bin/env python3
"""The norm forwards of 4 chunks a thread (``_launch_norm.norm_c4_plan``) on rows that are whole warps of 4 chunks
fewer than its power of two (bf16 3,072, 5,120, 6,144 columns: 96, 160, 192 threads, not 128, 256, 256), and the
norm backwards (``_launch_bwd.norm_bwd_plan``, 2 chunks: 192, 320, 384 threads, not 256, 512, 512), kernels alone
(torch.profiler, the L2 flushed before each call), us: the plan as shipped beside the plan at exactly those threads
(each row then fills its threads' chunks), outputs compared. A lead for the norms of softmax's
``_launch._whole_warps``, not shipped. Needs a GPU.

    python3 bench/diag_norm_whole_warps.py [--out FILE.json]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import per_kernel, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _launch, _launch_bwd, _launch_norm, _norms  # noqa: E402

SHAPES = [(torch.bfloat16, r, c) for r, c in ((16384, 3072), (4096, 5120), (16384, 5120), (4096, 6144),
                                               (16384, 6144), (8192, 8192))]
SHAPES += [(torch.float32, 16384, 3072)]


def _exact(plan, cols, itemsize, chunks):
    """``plan`` at exactly the threads of rows of whole warps of ``chunks`` chunks a thread, fewer than its own."""
    t = _launch._warps_of(cols, chunks, itemsize)
    if plan is None or plan.strategy not in ("block", "persistent", "split") or not t or t >= plan.block[0]:
        return plan
    return plan._replace(block=(t, *plan.block[1:]))


def _time(call, patch, module, name):
    """(us of ``call``'s kernels, its outputs) with ``module.name`` patched to ``patch`` (None: as shipped)."""
    orig = getattr(module, name)
    if patch is not None:
        setattr(module, name, patch)
    try:
        return sum(per_kernel(call, 20, flush=True).values()), call()
    finally:
        setattr(module, name, orig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    c4, bwd = _launch_norm.norm_c4_plan, _launch_bwd.norm_bwd_plan
    fwd_exact = lambda rows, cols, isz, props, arrays=2: _exact(c4(rows, cols, isz, props, arrays), cols, isz, 4)
    bwd_exact = lambda rows, cols, isz, props, arrays=2: _exact(bwd(rows, cols, isz, props, arrays), cols, isz,
                                                                _launch.ROW_CHUNKS)
    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt)
        g = torch.randn(rows, cols, device="cuda", dtype=dt)
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        _, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
        _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
        calls = {"layer_norm fwd": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5), _launch_norm,
                                    "norm_c4_plan", fwd_exact),
                 "rms_norm fwd": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6), _launch_norm, "norm_c4_plan",
                                  fwd_exact),
                 "layer_norm bwd": (lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w), _launch_bwd,
                                    "norm_bwd_plan", bwd_exact),
                 "rms_norm bwd": (lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w), _launch_bwd,
                                  "norm_bwd_plan", bwd_exact)}
        for op, (call, module, name, patch) in calls.items():
            rec = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols}
            rec["shipped_us"], want = _time(call, None, module, name)
            try:
                rec["whole_warps_us"], got = _time(call, patch, module, name)
            except Exception as exc:  # noqa: BLE001 -- a launch the kernels refuse is reported, not fatal
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                print(f"{op:14s} {rec['dtype']:8s} {rows}x{cols}: {rec['error']}", flush=True)
                records.append(rec)
                continue
            rec["max_diff"] = max((a.float() - c.float()).abs().max().item() for a, c in zip(want, got))
            rec["speedup"] = rec["shipped_us"] / rec["whole_warps_us"]
            records.append(rec)
            print(f"{op:14s} {rec['dtype']:8s} {rows}x{cols}: shipped {rec['shipped_us']:.2f} us, whole warps "
                  f"{rec['whole_warps_us']:.2f} us ({rec['speedup']:.3f}x), max diff {rec['max_diff']:.3g}", flush=True)
    write_records(args.out, records)


if __name__ == "__main__":
    main()
