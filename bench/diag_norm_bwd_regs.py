#!/usr/bin/env python3
"""The register-row norm backwards (norm.cu's ``rms_norm_bwd`` / ``layer_norm_bwd``) with fewer registers, so that two
or more blocks fit an SM where the shipped kernels (``__launch_bounds__(512, 1)``: up to 128 registers; ptxas gives
rms_norm_bwd<bf16> 114 on sm_90) hold one: bf16 5,120 columns run one block of 320 threads an SM.

The variants, each run through the shipped Python path (``_norms.*_bwd``) with its persistent plans' grid set to the
blocks the driver says an SM holds (``cuOccupancyMaxActiveBlocksPerMultiprocessor``) times the SMs:
- "occupancy": the shipped kernels at that grid (float rows of 320 threads take 96 registers: two blocks fit);
- "rR": norm.cu with ``__maxnreg__(R)`` on the two kernels in place of their launch bounds (ptxas, sm_90, bf16: 96
  spills 112-218 bytes);
- "smR": that, with their weight-gradient sums and weight row in dynamic shared memory as the 4-chunk backwards hold
  them (norm_bwd.cuh's ``SM``), the launch giving them that room (bf16: 96 registers and no spills).
Kernels alone (torch.profiler, the L2 flushed before each call), us, with the registers, the spilled bytes a thread
and the blocks an SM; outputs against the shipped kernels'. Needs a GPU.

    python3 bench/diag_norm_bwd_regs.py [--out FILE.json] [--variants r96,sm96]     (run from bench/)
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import beside_kernels, per_kernel, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _launch_bwd, _norms, _sources  # noqa: E402
from opsmith.ops._launch import ROW_CHUNKS, ROW_THREADS  # noqa: E402

BF, FP = torch.bfloat16, torch.float32
SHAPES = [(BF, 16384, 5120), (BF, 4096, 5120), (BF, 32768, 5120), (BF, 16384, 6144), (BF, 16384, 7168),
          (BF, 16384, 8192), (BF, 16384, 3072), (BF, 16384, 4096), (FP, 16384, 2560), (FP, 16384, 4096)]
KERNELS = ("rms_norm_bwd(", "layer_norm_bwd(")
BOUNDS = "__launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS)\n"
SM_RULE = "constexpr bool SM = C != OPSMITH_ROW_CHUNKS;"  # norm_bwd.cuh: the sums in shared memory at 4 chunks only


def _variant(name: str, dtype: str) -> CudaModule:
    """norm.cu with ``__maxnreg__(R)`` on the two register-row backwards (``name`` "rR"), or that with their
    weight-gradient sums and weight row in dynamic shared memory, as the 4-chunk backwards hold them ("smR": ptxas on
    sm_90, bf16, 96 registers and no spills where the sums in registers spill 112-218 bytes)."""
    regs = int(name.lstrip("rsm"))
    src = (_sources.KERNEL_DIR / "norm.cu").read_text()
    for k in KERNELS:
        assert src.count(BOUNDS + k) == 1, k
        src = src.replace(BOUNDS + k, f"__maxnreg__({regs})\n" + k)
    path = beside_kernels(f"norm_{name}.cu", src)
    if name.startswith("sm"):
        head = (path.parent / "norm_bwd.cuh").read_text()
        assert head.count(SM_RULE) == 2
        (path.parent / "norm_bwd.cuh").write_text(head.replace(SM_RULE, "constexpr bool SM = true;"))
    cc = torch.cuda.get_device_capability()
    return CudaModule(path, name_expressions=_sources.kernel_names("norm.cu", dtype), arch=f"sm_{cc[0]}{cc[1]}",
                      name=f"norm_{name}")


def _run(call, mod, dtype, kname, variant=""):
    """(us, outputs, {registers, local bytes, blocks an SM, grid}) of ``call`` with ``mod`` as norm.cu (None: as
    shipped; "occupancy": as shipped, at the grid the driver says fits) and its persistent plans' grid at the blocks
    the driver says fit (``variant`` "sm...": with the shared memory its sums and weight take)."""
    key = ("norm.cu", dtype, torch.cuda.current_device())
    info = {}
    k = _sources.kernel("norm.cu", kname, dtype, torch.cuda.current_device())  # the shipped programs loaded first
    saved_mod, saved_plan = _sources._modules[key], _launch_bwd.norm_bwd_plan
    if mod not in (None, "occupancy"):
        _sources._modules[key] = mod
        t, a = _sources.DTYPES[dtype]
        k = mod.get_kernel(kname.format(T=t, A=a))

    def plan(rows, cols, itemsize, props, arrays=2):
        p = saved_plan(rows, cols, itemsize, props, arrays)
        if p.strategy != "persistent":
            info.update(strategy=p.strategy)
            return p
        smem = (arrays * ROW_CHUNKS * (16 // itemsize) * 4 + ROW_CHUNKS * 16) * ROW_THREADS \
            if variant.startswith("sm") else 0
        if smem:
            k._state(torch.cuda.current_device()).opt_in_shared()  # past 48 KiB: before the occupancy question
        per_sm = k.occupancy(p.block[0] * p.block[1], smem)
        grid = max(1, min(per_sm * props.sm_count, -(-rows // (2 * p.block[1]))))
        grid = p.grid[0] if mod is None else grid  # None: the plan's
        info.update(block=list(p.block), per_sm=per_sm, grid=grid, smem=smem)
        return p._replace(grid=(grid,), shared_mem=smem)
    _launch_bwd.norm_bwd_plan = plan
    try:
        a_ = k.attributes
        info.update(registers=a_.registers, local_bytes=a_.local_bytes)
        return sum(per_kernel(call, 20, flush=True).values()), call(), info
    finally:
        _launch_bwd.norm_bwd_plan = saved_plan
        _sources._modules[key] = saved_mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--variants", default="r96,r80,r64,sm96,sm88,sm80")
    args = ap.parse_args()
    regs = args.variants.split(",")
    mods = {}
    records = []
    for dt, rows, cols in SHAPES:
        dtype = str(dt)[6:]
        for r in regs:
            if (r, dtype) not in mods:
                mods[(r, dtype)] = _variant(r, dtype)
        x, g = (torch.randn(rows, cols, device="cuda", dtype=dt) for _ in range(2))
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        _, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
        _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
        calls = {"rms_norm bwd": ("rms_norm_bwd<{T}, {A}>", lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w)),
                 "layer_norm bwd": ("layer_norm_bwd<{T}, {A}>",
                                    lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w))}
        for op, (kname, call) in calls.items():
            base = {"op": op, "dtype": dtype, "rows": rows, "cols": cols}
            us0, want, info0 = _run(call, None, dtype, kname)
            records.append({**base, "variant": "shipped", "us": us0, **info0})
            print(f"{op:15s} {dtype:8s} {rows}x{cols}: shipped {us0:8.2f} us  {info0}", flush=True)
            for r in ["occupancy", *regs]:  # the shipped kernels at the grid the driver says fits, then the variants
                try:
                    us, got, info = _run(call, mods[(r, dtype)] if r != "occupancy" else r, dtype, kname, r)
                except Exception as exc:  # noqa: BLE001 -- a variant the driver refuses is reported, not fatal
                    print(f"  {r}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                    records.append({**base, "variant": r, "error": str(exc)[:300]})
                    continue
                diff = max((p.float() - q.float()).abs().max().item() for p, q in zip(want, got) if p.numel())
                records.append({**base, "variant": r, "us": us, "speedup": us0 / us, "max_diff": diff, **info})
                print(f"  {r:9s}: {us:8.2f} us ({us0 / us:.3f}x) {info} diff {diff:.3g}", flush=True)
    write_records(args.out, records)


if __name__ == "__main__":
    main()
