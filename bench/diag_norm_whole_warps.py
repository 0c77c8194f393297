#!/usr/bin/env python3
"""The norms' rows that are whole warps of their chunks a thread fewer than the next power of two, at exactly those
threads (as shipped) beside the power of two (the plans before), kernels alone (torch.profiler, the L2 flushed before
each call), us, outputs compared:

- the forwards of 4 chunks a thread (``_launch_norm.norm_c4_plan``: bf16 3,072, 5,120, 6,144: 96, 160, 192 threads,
  not 128, 256, 256), of 8 (``norm_c8_plan``, ``add_rms_c8_plan``: bf16 10,240 and 12,288, 160 and 192, not 256) and
  of 2 (``norm_fwd_plan``: float rms_norm 3,072 at 384, not 512; add_rms_norm's register rows);
- the backwards of 2 (``_launch_bwd.norm_bwd_plan``: bf16 3,072, 5,120, 6,144: 192, 320, 384, not 256, 512, 512; the
  grid and rows a block those of the power of two).

"pow2" patches all five plan functions to the power of two at once. Needs a GPU.

    python3 bench/diag_norm_whole_warps.py [--out FILE.json]     (run from bench/)
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import per_kernel, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _fused, _launch, _launch_bwd, _launch_norm, _norms  # noqa: E402

BF, FP = torch.bfloat16, torch.float32
SHAPES = [(BF, 16384, 3072), (BF, 4096, 5120), (BF, 16384, 5120), (BF, 16384, 6144), (BF, 8192, 10240),
          (BF, 8192, 12288), (FP, 16384, 3072), (FP, 8192, 1536), (FP, 8192, 5120)]
PLANS = [(_launch_norm, "norm_c4_plan"), (_launch_norm, "norm_c8_plan"), (_launch_norm, "add_rms_c8_plan"),
         (_launch_norm, "norm_fwd_plan"), (_launch_bwd, "norm_bwd_plan")]


def _pow2(fn):
    """``fn`` (a plan function) with its plan's threads a row at the next power of two (the plans before)."""
    def plan(*args, **kwargs):
        p = fn(*args, **kwargs)
        if p is None or p.strategy not in ("block", "persistent", "split"):
            return p
        return p._replace(block=(1 << (p.block[0] - 1).bit_length(), *p.block[1:]))
    return plan


def _time(call, pow2):
    """(us of ``call``'s kernels, its outputs, the plans it took), every plan function at the power of two where
    ``pow2``."""
    saved = [getattr(m, n) for m, n in PLANS]
    if pow2:
        for (m, n), fn in zip(PLANS, saved):
            setattr(m, n, _pow2(fn))
    try:
        return sum(per_kernel(call, 20, flush=True).values()), call()
    finally:
        for (m, n), fn in zip(PLANS, saved):
            setattr(m, n, fn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    records = []
    for dt, rows, cols in SHAPES:
        x, r, g = (torch.randn(rows, cols, device="cuda", dtype=dt) for _ in range(3))
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        _, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
        _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
        calls = {"layer_norm fwd": lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5),
                 "rms_norm fwd": lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6),
                 "add_rms_norm fwd": lambda: _fused.add_rms_norm_cuda(x, r, [cols], w, 1e-6),
                 "layer_norm bwd": lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w),
                 "rms_norm bwd": lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w)}
        for op, call in calls.items():
            rec = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols}
            try:
                rec["shipped_us"], want = _time(call, False)
                rec["pow2_us"], got = _time(call, True)
            except Exception as exc:  # noqa: BLE001 -- a launch the kernels refuse is reported, not fatal
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                print(f"{op:16s} {rec['dtype']:8s} {rows}x{cols}: {rec['error']}", flush=True)
                records.append(rec)
                continue
            rec["max_diff"] = max((a.float() - c.float()).abs().max().item() for a, c in zip(want, got))
            rec["speedup"] = rec["pow2_us"] / rec["shipped_us"]
            records.append(rec)
            print(f"{op:16s} {rec['dtype']:8s} {rows}x{cols}: power of two {rec['pow2_us']:.2f} us, whole warps "
                  f"{rec['shipped_us']:.2f} us ({rec['speedup']:.3f}x), max diff {rec['max_diff']:.3g}", flush=True)
    write_records(args.out, records)


if __name__ == "__main__":
    main()
