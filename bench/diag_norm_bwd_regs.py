#!/usr/bin/env python3
"""The norm backwards at two blocks an SM (norm.cu's ``rms_norm_bwd_sm`` / ``layer_norm_bwd_sm``,
``_launch_bwd.norm_bwd_sm_plan``; 16-bit layer_norm excluded since it measured 0.96x) against the one-block
persistent kernels they replace: rows of 288-320 threads
(bf16 4,608 and 5,120 columns, float 2,304 and 2,560), where the 2-chunk backwards take 114-126 registers (bf16,
sm_90) and an SM holds one block. The ``_sm`` kernels hold their weight-gradient sums and the weight in shared memory
and take 96 registers.

The variants, each through the shipped Python path (``_norms.*_bwd``):
- "sm": as shipped (``norm_bwd_sm_plan``'s plan where it has one);
- "one": ``norm_bwd_sm_plan`` off, so the persistent kernels at ``norm_bwd_plan``'s grid (one block an SM);
- "occupancy": "one" with the grid at the blocks the driver says an SM holds
  (``cuOccupancyMaxActiveBlocksPerMultiprocessor``) times the SMs (float rows of 320 threads take 96 registers in
  the one-block kernels too).
Kernels alone (torch.profiler, the L2 flushed before each call), us, with the registers and the blocks an SM; the
outputs against "one"'s. The shapes beside (bf16 4,096, 6,144) take no ``_sm`` plan: their "sm" and "one" are the same
kernels, a measure of the noise. Needs a GPU.

    python3 bench/diag_norm_bwd_regs.py [--out FILE.json]     (run from bench/)
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import per_kernel, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _launch, _launch_bwd, _norms, _sources  # noqa: E402

BF, FP = torch.bfloat16, torch.float32
SHAPES = [(BF, 16384, 5120), (BF, 4096, 5120), (BF, 32768, 5120), (BF, 8192, 4608), (BF, 16384, 4608),
          (BF, 16384, 4096), (BF, 16384, 6144), (FP, 16384, 2560), (FP, 65536, 2560), (FP, 16384, 2304)]


def _run(call, variant, dtype, kname, plan_args):
    """(us, outputs, {strategy, grid, registers, blocks an SM}) of ``call`` under ``variant``; ``plan_args``:
    ``_norms._bwd_plan``'s, the plan ``call`` takes."""
    info = {}
    saved_sm, saved_plan = _launch_bwd.norm_bwd_sm_plan, _launch_bwd.norm_bwd_plan

    def plan(rows, cols, itemsize, props, arrays=2):
        p = saved_plan(rows, cols, itemsize, props, arrays)
        if p.strategy == "persistent" and variant == "occupancy":
            k = _sources.kernel("norm.cu", kname, dtype, torch.cuda.current_device())
            per_sm = k.occupancy(p.block[0] * p.block[1], 0)
            p = p._replace(grid=(max(1, min(per_sm * props.sm_count, -(-rows // (2 * p.block[1])))),))
        return p

    def sm_plan(*a):
        p = saved_sm(*a) if variant == "sm" else None
        if p is not None:
            k = _sources.kernel("norm.cu", kname.replace("_bwd<", "_bwd_sm<"), dtype, torch.cuda.current_device())
            k._state(torch.cuda.current_device()).opt_in_shared()
            info.update(per_sm=k.occupancy(p.block[0], p.shared_mem), registers=k.attributes.registers)
        return p
    _launch_bwd.norm_bwd_plan, _launch_bwd.norm_bwd_sm_plan = plan, sm_plan
    try:
        p, _ = _norms._bwd_plan(*plan_args)
        info.update(strategy=p.strategy, grid=p.grid[0], block=list(p.block))
        if "registers" not in info:
            k = _sources.kernel("norm.cu", kname, dtype, torch.cuda.current_device())
            info.update(registers=k.attributes.registers, per_sm=k.occupancy(p.block[0] * p.block[1], 0))
        return sum(per_kernel(call, 20, flush=True).values()), call(), info
    finally:
        _launch_bwd.norm_bwd_plan, _launch_bwd.norm_bwd_sm_plan = saved_plan, saved_sm



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    records = []
    for dt, rows, cols in SHAPES:
        dtype = str(dt)[6:]
        x, g = (torch.randn(rows, cols, device="cuda", dtype=dt) for _ in range(2))
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        _, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
        _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
        calls = {"rms_norm bwd": ("rms_norm_bwd<{T}, {A}>", 1,
                                  lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w)),
                 "layer_norm bwd": ("layer_norm_bwd<{T}, {A}>", 2,
                                    lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w))}
        for op, (kname, arrays, call) in calls.items():
            plan_args = (rows, cols, x, arrays, g, x, w, x)
            base = {"op": op, "dtype": dtype, "rows": rows, "cols": cols}
            us0, want, info0 = _run(call, "one", dtype, kname, plan_args)
            records.append({**base, "variant": "one", "us": us0, **info0})
            print(f"{op:15s} {dtype:8s} {rows}x{cols}: one {us0:8.2f} us  {info0}", flush=True)
            for v in ("occupancy", "sm"):
                us, got, info = _run(call, v, dtype, kname, plan_args)
                diff = max((p.float() - q.float()).abs().max().item() for p, q in zip(want, got) if p.numel())
                records.append({**base, "variant": v, "us": us, "speedup": us0 / us, "max_diff": diff, **info})
                print(f"  {v:9s}: {us:8.2f} us ({us0 / us:.3f}x) {info} diff {diff:.3g}", flush=True)
    write_records(args.out, records)
    print(f"(device: {torch.cuda.get_device_name()}, {_launch.device_props(0).sm_count} SMs)")


if __name__ == "__main__":
    main()
