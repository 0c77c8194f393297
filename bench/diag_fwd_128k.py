#!/usr/bin/env python3
"""The norm forwards of rows of 64-128 KiB (float 16,384-32,768 columns, bf16 32,768-65,536) on devices of much DRAM
bandwidth an SM (the H200: compile's fp32 rms_norm read 4,051 GB/s at 2048x32768 where ours read 3,532): the shipped
plan (norm_l2.cu's two passes, one block an SM past 96 KiB, two blocks below) against the kernels of one block an SM
(B1: as shipped, 8 chunks a trip in the first pass and 4 in the second, layer_norm's threads a row a constant), the
kernels before (B1_u4: 4 chunks a trip in both passes, the threads read from blockDim), 8 in both (B1_u8: the whole
row in one trip, as compile's Triton kernel, which spills), the first pass's 8 with the threads from blockDim for
both ops (B1_f8) or a constant for both (B1_f8c), the second pass's weights loaded chunk by chunk after the math of
the chunk before (as B = 2) at 8 chunks a trip (B1_w8, ``OPSMITH_L2_ONE_WFIRST`` 0) and at 4 (B1_w4), two blocks an
SM (B2, of 1,024 threads and of 512), the row held in registers in one pass by one block of up to 1,024 threads
(norm_fwd.cuh's rows at 8 chunks a thread, extra kernels compiled here), torch.compile(dynamic=False) and
Liger-Kernel; add_rms_norm and add_layer_norm as shipped, at one block an SM (B1: 4 chunks of x and of residual a trip
in the first pass) with 2 (B1_a2, ``OPSMITH_L2_ADD_FIRST_ONE``: the kernels before), at two blocks an SM (B2), and
compile's add and norm; kernels alone (torch.profiler, us a call) as GB/s of the bytes-moved floor beside a copy of
the same bytes, each output checked against the shipped one. Needs a GPU; Liger is optional (PYTHONPATH to its
wheel's files).

    python3 bench/diag_fwd_128k.py [--out FILE.json] [--no-compile]
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from _kernel_timing import beside_kernels  # noqa: E402  (bench/, this script's folder)
from diag_norm_split import per_kernel  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _fused, _launch, _launch_norm, _norms, _sources  # noqa: E402

try:
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
except ImportError:
    layer_norm_forward = rms_norm_forward = None

REGS = """
#include "norm_fwd.cuh"
using namespace opsmith;
template <class T, class A>
__global__ void __launch_bounds__(1024, 1)
diag_layer_norm_fwd_r8(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols,
                       A eps, int has_w, int has_b) {
    layer_norm_fwd_any<1, T, A, 8>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}
template <class T, class A>
__global__ void __launch_bounds__(1024, 1)
diag_rms_norm_fwd_r8(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                     long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_any<T, A, 8>(x, w, y, rstd, rows, cols, eps, has_w);
}
"""
SHAPES = [(torch.float32, r, c) for r, c in ((2048, 32768), (4096, 32768), (4096, 24576), (4096, 16384),
                                              (8192, 16384))]
SHAPES += [(torch.bfloat16, r, c) for r, c in ((2048, 65536), (4096, 32768))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    arch = _driver.device_arch(0)
    props = _launch.device_props(0)
    regs_src = beside_kernels("norm_r8.cu", REGS)
    l2_src = _sources.KERNEL_DIR / "norm_l2.cu"
    mods = {}
    records = []
    for dt, rows, cols in SHAPES:
        dts = str(dt)[6:]
        t, a = _sources.DTYPES[dts]
        if dts not in mods:
            ln_l2 = [f"layer_norm_fwd_l2<{b}, {t}, {a}>" for b in (1, 2)]
            rms_l2 = [f"rms_norm_fwd_l2<{b}, {t}, {a}>" for b in (1, 2)]
            add_l2 = [f"add_{op}_fwd_l2<{b}, {t}, {a}>" for op in ("layer_norm", "rms_norm") for b in (1, 2)]
            one = ln_l2[:1] + rms_l2[:1]  # the kernels of B = 1

            def l2_mod(key, names, **defines):  # norm_l2.cu under `defines`
                return CudaModule(l2_src, name_expressions=names, arch=arch, name=f"diag-128k-{key}-{dts}",
                                  include_paths=[_sources.KERNEL_DIR], defines=defines,
                                  options=["--ptxas-options=-v"])

            mods[dts] = {
                "u8": l2_mod("u8", ln_l2 + rms_l2, OPSMITH_L2_UNROLL_ONE=8, OPSMITH_L2_FIRST_ONE=8),
                "l2": l2_mod("l2", ln_l2 + rms_l2 + add_l2),
                "u4": l2_mod("u4", one, OPSMITH_L2_FIRST_ONE=4, OPSMITH_L2_LN_FIXED=0),
                "f8": l2_mod("f8", one, OPSMITH_L2_LN_FIXED=0),
                "w8": l2_mod("w8", one, OPSMITH_L2_ONE_WFIRST=0, OPSMITH_L2_UNROLL_ONE=8),
                "w4": l2_mod("w4", one, OPSMITH_L2_ONE_WFIRST=0),
                "f8c": l2_mod("f8c", one, OPSMITH_L2_RMS_FIXED=1),
                "a2": l2_mod("a2", add_l2[::2], OPSMITH_L2_ADD_FIRST_ONE=2),
                "r8": CudaModule(regs_src, name_expressions=[f"diag_layer_norm_fwd_r8<{t}, {a}>",
                                                             f"diag_rms_norm_fwd_r8<{t}, {a}>"],
                                 arch=arch, name=f"diag-128k-r8-{dts}", options=["--ptxas-options=-v"]),
            }
        m = mods[dts]
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        gb = 2 * rows * cols * x.element_size() / 1e3
        out = torch.empty_like(x)
        copy = gb / sum(per_kernel(lambda: out.copy_(x)).values())
        vecs = cols // (16 // x.element_size())
        l2cfg = _launch.launch_config(_launch.Plan("l2", (rows,), (min(1024, vecs // 2), 1), 0, 0))
        l2half = _launch.launch_config(_launch.Plan("l2", (rows,), (min(512, vecs // 2), 1), 0, 0))
        r8cfg = _launch.launch_config(_launch.Plan("block", (rows,), (vecs // 8, 1), 0, 0))
        y = torch.empty_like(x)
        st, st2 = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")

        def ln_k(mod, name, cfg):
            k = mod.get_kernel(name)
            return lambda: (k.launch(cfg, x, w, b, y, st, st2, rows, cols, 1e-5, 1, 1), y)[1]

        def rms_k(mod, name, cfg):
            k = mod.get_kernel(name)
            return lambda: (k.launch(cfg, x, w, y, st, rows, cols, 1e-6, 1), y)[1]

        res, s_out = torch.randn_like(x), torch.empty_like(x)

        def add_ln_k(mod, name, cfg):
            k = mod.get_kernel(name)
            return lambda: (k.launch(cfg, x, res, w, b, y, s_out, st, st2, rows, cols, 1e-5, 1, 1), y)[1]

        def add_rms_k(mod, name, cfg):
            k = mod.get_kernel(name)
            return lambda: (k.launch(cfg, x, res, w, y, s_out, st, rows, cols, 1e-6, 1), y)[1]

        def compiled(norm):  # compile's add and norm, y and s written
            if not args.no_compile:
                return torch.compile(lambda: (lambda s: (norm(s), s))(x + res), dynamic=False)

        torch._dynamo.reset()
        cases = {
            "layer_norm": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0], ln_k, "layer_norm",
                           None if args.no_compile else
                           torch.compile(lambda: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False),
                           layer_norm_forward and (lambda: layer_norm_forward(x, w, b, 1e-5))),
            "rms_norm": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0], rms_k, "rms_norm",
                         None if args.no_compile else
                         torch.compile(lambda: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False),
                         rms_norm_forward and (lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None))),
        }
        adds = {
            "add_layer_norm": (lambda: _fused.add_layer_norm_cuda(x, res, [cols], w, b, 1e-5)[0], add_ln_k,
                               compiled(lambda s: F.layer_norm(s, (cols,), w, b, 1e-5))),
            "add_rms_norm": (lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6)[0], add_rms_k,
                             compiled(lambda s: F.rms_norm(s, (cols,), w, 1e-6))),
        }
        for op, (ours, mk, comp) in adds.items():  # x and residual read, y and s written: twice the bytes
            variants = {"shipped": ours, "B1": mk(m["l2"], f"{op}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B1_a2": mk(m["a2"], f"{op}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B2": mk(m["l2"], f"{op}_fwd_l2<2, {t}, {a}>", l2cfg)}
            cases[op] = (ours, variants, comp, None, 2 * gb)
        for op in ("layer_norm", "rms_norm"):
            ours, mk, name, comp, liger = cases[op]
            variants = {"shipped": ours,
                        "B1": mk(m["l2"], f"{name}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B1_u4": mk(m["u4"], f"{name}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B1_u8": mk(m["u8"], f"{name}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B1_f8": mk(m["f8"], f"{name}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B1_f8c": mk(m["f8c"], f"{name}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B1_w8": mk(m["w8"], f"{name}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B1_w4": mk(m["w4"], f"{name}_fwd_l2<1, {t}, {a}>", l2cfg),
                        "B2": mk(m["l2"], f"{name}_fwd_l2<2, {t}, {a}>", l2cfg),
                        "B2_512": mk(m["l2"], f"{name}_fwd_l2<2, {t}, {a}>", l2half)}
            if vecs // 8 <= 1024:
                variants["regs8"] = mk(m["r8"], f"diag_{name}_fwd_r8<{t}, {a}>", r8cfg)
            cases[op] = (ours, variants, comp, liger, gb)
        for op, (ours, variants, comp, liger, op_gb) in cases.items():
            ref = ours().clone()
            if comp:
                variants["compile"] = comp
            if liger:
                variants["liger"] = liger
            plan = _launch_norm.norm_l2_plan(rows, cols, x.element_size(), props, 2 if "layer" in op else 1)
            rec = {"op": op, "dtype": dts, "rows": rows, "cols": cols, "copy": copy,
                   "plan": {"block": plan.block, "chunks": plan.chunks} if plan else None}
            for v, f in variants.items():
                if v not in ("compile", "liger"):
                    got = f()
                    rec[f"{v}_maxdiff"] = float((got.float() - ref.float()).abs().max())
                rec[v] = op_gb / sum(per_kernel(f).values())
            records.append(rec)
            cells = "  ".join(f"{v} {rec[v]:5.0f}" for v in variants)
            best = max(rec[v] for v in variants if v not in ("compile", "liger"))
            print(f"{op:<14} {dts:<8} {rows:>5}x{cols:<6} GB/s {cells}  copy {copy:5.0f}  "
                  f"best/shipped {best / rec['shipped']:.3f}x", flush=True)
    for dts, ms in mods.items():
        for k, mod in ms.items():
            lines = [ln for ln in mod.binary.log.splitlines() if "registers" in ln or "spill" in ln or "Function" in ln]
            print(f"-- {dts} {k}\n" + "\n".join(lines[:12]))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "command": " ".join(sys.argv), "records": records}, indent=1))


if __name__ == "__main__":
    main()
