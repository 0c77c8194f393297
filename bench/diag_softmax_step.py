#!/usr/bin/env python3
"""softmax's forward + backward as the peers benchmark times it (one forward and one torch.autograd.grad, the L2
flushed before each), taken apart: each kernel's us in that step (torch.profiler) for opsmith.ops.softmax and
Liger-Kernel's, then the backward's launch variants timed where the step runs them (the L2 flushed, our forward,
then the variant through ``_functional.softmax_bwd`` with ``_launch.softmax_plan`` patched). Each variant's output is checked against the plan's. Needs a GPU (Liger on the path for
its rows).

    PYTHONPATH=/tmp/liger python3 bench/diag_softmax_step.py [--out FILE.json] [--runs 30]
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from _kernel_timing import per_kernel, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch  # noqa: E402

SHAPES = [(torch.bfloat16, r, c) for r, c in ((4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192),
                                               (65536, 8192), (4096, 16384), (2048, 32768))]
Plan = _launch.Plan


def _tprs(cols, chunks, vec, limit):
    """The threads a row of ``chunks`` chunks a thread: the power of two the plans take and, where the row is whole
    warps of exactly that many chunks a thread, that many threads (every chunk inside the row: ROW_FULL)."""
    out = [_launch._pow2_at_least(-(-cols // (chunks * vec)))]
    exact = _launch._warps_of(cols, chunks, 16 // vec)
    if exact and exact not in out:
        out.append(exact)
    return [t for t in out if 32 <= t <= limit]


def bwd_variants(rows, cols, itemsize):
    """name -> the backward's Plan (its kernel follows from strategy and chunks, as in _functional.softmax_bwd)."""
    vec = 16 // itemsize
    out = {}
    for chunks, name in ((_launch.ROW_CHUNKS, "block"), (_launch.WIDE_CHUNKS, "wide"), (_launch.WIDE8_CHUNKS, "wide8")):
        limit = _launch.ROW_THREADS if name == "block" else _launch.LONG_THREADS
        for tpr in _tprs(cols, chunks, vec, limit):
            for k in (1, 2) if name != "block" else (1,):
                if tpr * k <= limit:
                    out[f"{name}_{tpr}x{k}"] = Plan("block" if name == "block" else "wide", (-(-rows // k),),
                                                    (tpr, k), 0, 0, 1, chunks if chunks == 8 else 0)
    return out


def fwd_variants(cols, itemsize):
    """name -> (kernel, block) for the forward (the full kernels where the row fills their threads' chunks)."""
    vec = 16 // itemsize
    out = {}
    for t in _tprs(cols, 2, vec, _launch.ROW_THREADS):
        if t * 2 * vec == cols:
            out[f"full_{t}x1"] = ("softmax_fwd_full<{T}>", (t, 1))
    for t in _tprs(cols, 4, vec, _launch.WIDE3_THREADS):
        if t * 4 * vec == cols:
            if t <= _launch.C4_THREADS:
                out[f"wide_full_{t}x1"] = ("softmax_fwd_wide_full<{T}>", (t, 1))
            out[f"wide3_full_{t}x1"] = ("softmax_fwd_wide3_full<{T}>", (t, 1))
    for t in _tprs(cols, 4, vec, _launch.LONG_THREADS):
        out[f"wide_{t}x1"] = ("softmax_fwd_wide<{T}, 4>", (t, 1))
    for t in _tprs(cols, 8, vec, _launch.LONG_THREADS):
        out[f"wide8_{t}x1"] = ("softmax_fwd_wide<{T}, 8>", (t, 1))
    return out


# the device tool's H200, the runs' device (bench/results/ops-softmax-h200-2026-12-04/): for --table's plans
H200 = _launch.DeviceProps(132, 1024, 2048, 232448, 233472, True, 4814)


# the forward kernels (_launch.softmax_fwd_kernel's names) that fwd_variants times, by their names' prefix there
_FWD_PREFIX = {"softmax_fwd_full<{T}>": "full", "softmax_fwd_wide_full<{T}>": "wide_full",
               "softmax_fwd_wide3_full<{T}>": "wide3_full", "softmax_fwd_wide<{T}, 4>": "wide",
               "softmax_fwd_wide<{T}, 8>": "wide8"}


def _variant(plan, cols, itemsize, arrays):
    """The name of the variant above that runs ``plan``'s kernel at its launch (None: none of them)."""
    if plan.strategy not in ("block", "wide") or plan.chunks or plan.block[1] != 1:
        return None
    if arrays == 2:
        return f"{plan.strategy}_{plan.block[0]}x1"
    prefix = _FWD_PREFIX.get(_launch.softmax_fwd_kernel(plan, cols, itemsize, True)[1])
    return f"{prefix}_{plan.block[0]}x1" if prefix else None


def table(paths) -> str:
    """The shipped plans' fwd + bwd kernels in the step beside this tree's plans' (their variants' kernels, timed
    in place by the runs of ``paths``) and Liger-Kernel's, us, from those runs' JSON (no GPU)."""
    lines = ["dtype rows x cols: shipped fwd + bwd kernels (in the step) -> this tree's plans' kernels (the variants "
             "timed in place) | Liger-Kernel's, us; this tree's fwd / bwd variant"]
    for path in paths:
        for r in json.loads(Path(path).read_text())["records"]:
            isz = getattr(torch, r["dtype"]).itemsize
            names = [_variant(_launch.softmax_plan(r["rows"], r["cols"], isz, a, H200), r["cols"], isz, a)
                     for a in (1, 2)]
            fwd, bwd = r.get("fwd_variants", {}).get(names[0] or ""), r["bwd_variants"].get(names[1] or "")
            ours = r["opsmith_step_kernels_us"]
            old_f = sum(v for k, v in ours.items() if "fwd" in k)
            old_b = sum(v for k, v in ours.items() if "bwd" in k)
            # no variant name: a forward plan that is not a register row's (clusters), as shipped
            new_f = fwd["fwd_us"] if fwd else old_f if names[0] is None or "fwd_variants" not in r else None
            new_b = bwd["bwd_us"] if bwd else None
            lig = r.get("liger_step_sum_us")
            new = f"{new_f + new_b:.1f}" if new_f is not None and new_b is not None else "(not timed)"
            lines.append(f"{r['dtype']} {r['rows']}x{r['cols']}: {old_f + old_b:.1f} -> {new} | "
                         f"{lig or float('nan'):.1f}; {names[0]} / {names[1]}")
    return "\n".join(lines)


def _shape(text):
    dt, rc = text.split(":")
    r, c = rc.split("x")
    return getattr(torch, dt), int(r), int(c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--shapes", help="dtype:ROWSxCOLS,... (default: SHAPES)")
    ap.add_argument("--no-step", action="store_true", help="the variants only")
    ap.add_argument("--no-variants", action="store_true", help="the step only")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print table() of these runs' JSON (no GPU)")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    shapes = [_shape(t) for t in args.shapes.split(",")] if args.shapes else SHAPES
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:
        lf = None
    orig = _launch.softmax_plan
    props = _launch.device_props(0)
    records = []
    for dt, rows, cols in shapes:
        torch.manual_seed(0)
        x = torch.randn(rows, cols, device="cuda", dtype=dt, requires_grad=True)
        g = torch.randn(rows, cols, device="cuda", dtype=dt)
        nb = x.element_size() * rows * cols
        rec = {"dtype": str(dt)[6:], "rows": rows, "cols": cols, "fwd_mb": 2 * nb / 2**20,
               "plan_fwd": str(orig(rows, cols, x.element_size(), 1, props)),
               "plan_bwd": str(orig(rows, cols, x.element_size(), 2, props))}
        impls = {} if args.no_step else {"opsmith": lambda t: ops.softmax(t, -1)}
        if lf is not None and not args.no_step:
            impls["liger"] = lf.liger_softmax
        for name, f in impls.items():
            def step(f=f):
                torch.autograd.grad((f(x),), (x,), (g,))
            k = per_kernel(step, args.runs, flush=True)
            rec[f"{name}_step_kernels_us"] = k
            rec[f"{name}_step_sum_us"] = sum(k.values())
            r = ops.benchmark(step, bytes_moved=5 * nb, runs=args.runs, warmup=3)
            rec[f"{name}_step_gbps"] = r.gbps
        xd = x.detach()
        y = fn.softmax_fwd(xd)
        want = fn.softmax_bwd(g, y)
        bwd = {}
        for vname, plan in ({} if args.no_variants else bwd_variants(rows, cols, x.element_size())).items():
            _launch.softmax_plan = lambda *a, plan=plan: plan if a[3] == 2 else orig(*a)
            try:
                def body():
                    fn.softmax_bwd(g, fn.softmax_fwd(xd))
                kern = per_kernel(body, args.runs, flush=True)
                got = fn.softmax_bwd(g, y)
            except Exception as exc:  # noqa: BLE001 -- a variant the kernels refuse is reported, not fatal
                bwd[vname] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                continue
            finally:
                _launch.softmax_plan = orig
            b_us = sum(v for kname, v in kern.items() if "bwd" in kname)
            bwd[vname] = {"bwd_us": b_us, "gbps": 3 * nb / (b_us * 1e-6) / 1e9,
                          "max_diff": (got.float() - want.float()).abs().max().item()}
        rec["bwd_variants"] = bwd
        fwd = {}
        for vname, (kname, block) in ({} if args.no_variants else fwd_variants(cols, x.element_size())).items():
            cfg = _launch.launch_config(Plan("diag", (-(-rows // block[1]),), block, 0, 0))
            out = torch.empty_like(xd)
            try:
                k = fn._kernel("softmax.cu", kname, xd)
                kern = per_kernel(lambda: k.launch(cfg, xd, out, rows, cols), args.runs, flush=True)
            except Exception as exc:  # noqa: BLE001
                fwd[vname] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                continue
            f_us = sum(kern.values())
            fwd[vname] = {"fwd_us": f_us, "gbps": 2 * nb / (f_us * 1e-6) / 1e9,
                          "max_diff": (out.float() - y.float()).abs().max().item()}
        rec["fwd_variants"] = fwd
        records.append(rec)
        s = f"{rec['dtype']} {rows}x{cols}: fwd {rec['plan_fwd']}, bwd {rec['plan_bwd']}"
        if impls:
            s += f"; step ours {rec['opsmith_step_gbps']:.0f}"
        if "liger" in impls:
            s += f" liger {rec['liger_step_gbps']:.0f} ({rec['opsmith_step_gbps'] / rec['liger_step_gbps']:.3f}x)"
        print(s, flush=True)
        for name in impls:
            print("   ", name, {k: round(v, 2) for k, v in rec[f"{name}_step_kernels_us"].items()}, flush=True)
        print("    bwd after our fwd:", {k: (round(v["bwd_us"], 2), round(v["gbps"]), v["max_diff"])
                                        if "bwd_us" in v else v["error"] for k, v in bwd.items()}, flush=True)
        print("    fwd after a flush:", {k: (round(v["fwd_us"], 2), round(v["gbps"]), v["max_diff"])
                                         if "fwd_us" in v else v["error"] for k, v in fwd.items()}, flush=True)
    write_records(args.out, records)

if __name__ == "__main__":
    main()
