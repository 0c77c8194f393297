#!/usr/bin/env python3
"""Where the norms' forward+backward spends its time on small shapes (where it is slower than
eager), and which persistent-backward grid is fastest there.

1. ``--profile``: torch.profiler's CUDA kernels of one forward+backward (opsmith, torch eager),
   mean microseconds of each kernel over ``--runs`` steps (L2 flushed before each step).
2. ``--sweep``: the register-row backward kernel alone with other grids (blocks of 256 or 512
   threads, 1/2/4 blocks per SM, or the plan's) and the reduction of its partial sums (torch's
   ``sum(0)`` + cast, as shipped), CUDA events, median, L2 flushed.

    python3 bench/diag_norm_bwd.py --profile --sweep --json OUT.json
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsmith import ops
from _kernel_timing import flush_l2, median_us  # noqa: E402  (bench/ is the script's folder)
from opsmith.ops import _launch, _sources

SHAPES = [(2048, 2048), (4096, 2048), (8192, 2048), (4096, 4096), (16384, 4096), (65536, 1024), (8192, 8192)]




def steps(op: str, impl: str, rows: int, cols: int):
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    w = torch.randn(cols, dtype=x.dtype, device="cuda", requires_grad=True)
    b = torch.randn(cols, dtype=x.dtype, device="cuda", requires_grad=True)
    g = torch.randn_like(x)
    if op == "rms_norm":
        f = ops.rms_norm if impl == "opsmith" else torch.nn.functional.rms_norm
        fn, leaves = (lambda: f(x, (cols,), w, 1e-6)), (x, w)
    else:
        f = ops.layer_norm if impl == "opsmith" else torch.nn.functional.layer_norm
        fn, leaves = (lambda: f(x, (cols,), w, b, 1e-5)), (x, w, b)
    return lambda: torch.autograd.grad(fn(), leaves, g)


def profile(runs: int) -> list[dict]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    rows_out = []
    for op in ("rms_norm", "layer_norm"):
        for rows, cols in SHAPES:
            for impl in ("opsmith", "eager"):
                step = steps(op, impl, rows, cols)
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                with prof(activities=[ProfilerActivity.CUDA]) as p:
                    for _ in range(runs):
                        flush_l2()
                        step()
                    torch.cuda.synchronize()
                per = collections.defaultdict(float)
                for e in p.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        per[e.name[:90]] += getattr(e, "device_time", 0) / runs
                per.pop(next((k for k in per if "FillFunctor<unsigned char>" in k), None), None)  # the L2 flush
                total = sum(per.values())
                rows_out.append({"op": op, "impl": impl, "shape": [rows, cols], "kernels_us": dict(per),
                                 "total_us": total})
                print(f"{op:10s} {impl:8s} {rows}x{cols}: {total:7.1f} us of kernels", flush=True)
                for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
                    print(f"      {v:7.1f}  {k}", flush=True)
    return rows_out


CONFIGS = {  # name: norm.cu defines
    "c2 pf0 (shipped)": {},
    "c2 pf0 rmsB1": {"OPSMITH_ROW_BWD_BLOCKS": 1},
    "c1 pf0 B2": {"OPSMITH_ROW_CHUNKS": 1, "OPSMITH_ROW_BWD_BLOCKS": 2, "OPSMITH_LN_BWD_BLOCKS": 2},
    "c1 pf1 B2": {"OPSMITH_ROW_CHUNKS": 1, "OPSMITH_BWD_PREFETCH": 1, "OPSMITH_ROW_BWD_BLOCKS": 2,
                  "OPSMITH_LN_BWD_BLOCKS": 2},
    "c2 pf1 B1": {"OPSMITH_BWD_PREFETCH": 1, "OPSMITH_ROW_BWD_BLOCKS": 1, "OPSMITH_LN_BWD_BLOCKS": 1},
}


def sweep(runs: int, dtype: str) -> list[dict]:
    from opsmith._runtime import _driver
    from opsmith._torch._cuda_module import CudaModule
    props = _launch.device_props(0)
    tdt = getattr(torch, dtype)
    vec = 16 // torch.empty(0, dtype=tdt).element_size()
    names = _sources.kernel_names("norm.cu", dtype)
    rows_out = []
    for cname, defines in CONFIGS.items():
        chunks = defines.get("OPSMITH_ROW_CHUNKS", 2)
        mod = CudaModule(_sources.KERNEL_DIR / "norm.cu", name_expressions=names, arch=_driver.device_arch(0),
                         defines=defines, name=f"norm-diag-{len(rows_out)}-{chunks}")
        k = {n.split("<")[0]: mod.get_kernel(n) for n in names}
        for rows, cols in SHAPES:
            x = torch.randn(rows, cols, dtype=tdt, device="cuda")
            g, w = torch.randn_like(x), torch.randn(cols, dtype=x.dtype, device="cuda")
            dx, dw_out = torch.empty_like(x), torch.empty(cols, dtype=x.dtype, device="cuda")
            mean, rstd = torch.randn(rows, device="cuda"), torch.rand(rows, device="cuda") + 0.5
            tpr = 1 << max(0, (-(-cols // (chunks * vec)) - 1).bit_length())
            if tpr > 512:
                continue
            per_block = max(1, 256 // tpr)
            plans = {f"{m}/SM": (min(m * props.sm_count, -(-rows // per_block)), 1) for m in (1, 2, 3, 4)}
            plans["one trip, no dw"] = (-(-rows // per_block), 0)
            for pname, (grid, want) in plans.items():
                cfg = _launch.launch_config(_launch.Plan("persistent", (grid,), (tpr, per_block), 0, 0))
                pw, pb = (torch.empty(grid if want else 1, cols, device="cuda") for _ in range(2))
                for op in ("rms_norm", "layer_norm"):
                    if op == "rms_norm":
                        def fn():
                            k["rms_norm_bwd"].launch(cfg, g, x, w, rstd, dx, pw, rows, cols, 1, want, x, 0, x, 0)
                    else:
                        def fn():
                            k["layer_norm_bwd"].launch(cfg, g, x, w, mean, rstd, dx, pw, pb, rows, cols, 1, want, want,
                                                       x, x, 0)
                    kern = median_us(fn, runs)
                    rec = {"config": cname, "op": op, "shape": [rows, cols], "dtype": dtype, "plan": pname,
                           "grid": grid, "block": [tpr, per_block], "kernel_us": kern,
                           "gbps": 3 * x.numel() * x.element_size() / kern / 1e3}
                    line = (f"{cname:17s} {op:10s} {rows}x{cols} {pname:16s} grid {grid:5d} block ({tpr},{per_block}): "
                            f"kernel {kern:6.1f} us {rec['gbps']:5.0f} GB/s")
                    if want:
                        csum = _sources_col_sum(k, cfg, pw, pb, dw_out, grid, cols, op)
                        both = median_us(lambda: (fn(), csum()), runs)  # noqa: B023
                        torch_red = median_us(lambda: (fn(), pw.sum(0).to(tdt)), runs)  # noqa: B023
                        rec.update(both_us=both, with_torch_sum_us=torch_red)
                        line += f"  + col_sum {both:6.1f} us  (+ torch sum {torch_red:6.1f})"
                    rows_out.append(rec)
                    print(line, flush=True)
    return rows_out


def _sources_col_sum(k, cfg, pw, pb, out, prows, cols, op):
    from opsmith._runtime._launch_config import LaunchConfig
    lc = LaunchConfig((-(-cols // 32), 2 if op == "layer_norm" else 1), (32, 32), 0)
    out2 = torch.empty_like(out)
    return lambda: k["norm_col_sum"].launch(lc, pw, pb, out, out2, prows, cols)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--dtypes", default="bfloat16")
    args = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.profile:
        out["profile"] = profile(args.runs)
    if args.sweep:
        out["sweep"] = [r for d in args.dtypes.split(",") for r in sweep(args.runs, d)]
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
