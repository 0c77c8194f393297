#!/usr/bin/env python3
"""The norm forwards' rows of 32 and 64 KiB (bf16 16,384 and 32,768; float 8,192 and 16,384) in one pass, the row held
in registers at 8 chunks a thread (256 threads a row for 32 KiB, 512 for 64 KiB; layer_norm and rms_norm from
norm_fwd.cuh's rows, add_rms_norm from fused_norm.cu's, compiled here as extra kernels, diag_*), against the L2 rows
(norm_l2.cu: two passes, the second from L2; norm_c8_plan and add_rms_c8_plan declined for them, since 67fa1b9 and
2ecdfc0 ship some of these rows at 8 chunks), Liger-Kernel's one-pass Triton rows and torch.compile(dynamic=False);
kernels alone (torch.profiler, us a call) as GB/s of the bytes-moved floor, beside a copy of the same bytes; each
result checked against the L2 rows'. Needs a GPU; Liger is optional (PYTHONPATH to its wheel's files).

    python3 bench/diag_fwd_long1.py [--out FILE.json] [--no-compile]
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
    from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
except ImportError:
    layer_norm_forward = None

EXTRA = """
#include "norm_fwd.cuh"
#include "fused_norm.cu"
using namespace opsmith;
"""
for _name, _threads, _blocks in (("c8", 256, 2), ("c8k", 512, 1)):  # written out: opsmith reads the signatures
    EXTRA += f"""
template <class T, class A>
__global__ void __launch_bounds__({_threads}, {_blocks})
diag_layer_norm_fwd_{_name}(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols,
                       A eps, int has_w, int has_b) {{
    layer_norm_fwd_any<1, T, A, 8>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}}
template <class T, class A>
__global__ void __launch_bounds__({_threads}, {_blocks})
diag_rms_norm_fwd_{_name}(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                     long long rows, int cols, A eps, int has_w) {{
    rms_norm_fwd_any<T, A, 8>(x, w, y, rstd, rows, cols, eps, has_w);
}}
// every shape below is whole chunks of whole vectors (ROW_FULL): 8 x 16 bytes x tpr
template <class T, class A>
__global__ void __launch_bounds__({_threads}, {_blocks})
diag_add_rms_norm_fwd_{_name}(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                         T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows,
                         int cols, A eps, int has_w) {{
    add_rms_norm_fwd_row<ROW_FULL, T, A, 8>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}}
"""
NAMES = [f"diag_{op}_fwd_{k}<{{T}}, {{A}}>" for op in ("layer_norm", "rms_norm", "add_rms_norm") for k in ("c8", "c8k")]
SHAPES = [(torch.bfloat16, r, c) for r, c in ((4096, 16384), (8192, 16384), (2048, 32768), (4096, 32768))]
SHAPES += [(torch.float32, r, c) for r, c in ((8192, 8192), (4096, 16384))]


def _add_rms(x, r, w):
    s = x + r
    return F.rms_norm(s, (s.shape[-1],), w, 1e-6), s


def _l2_rows(f):
    """f with norm_c8_plan and add_rms_c8_plan declined (67fa1b9 and 2ecdfc0 ship these rows at 8 chunks, which
    this script's own kernels time): the L2 rows, as before them."""
    def run():
        c8, add_c8 = _launch_norm.norm_c8_plan, _launch_norm.add_rms_c8_plan
        _launch_norm.norm_c8_plan = _launch_norm.add_rms_c8_plan = lambda *a: None
        try:
            return f()
        finally:
            _launch_norm.norm_c8_plan, _launch_norm.add_rms_c8_plan = c8, add_c8
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its minutes of compiling)")
    args = ap.parse_args()
    src = beside_kernels("norm_rows1.cu", EXTRA)
    mods = {}
    records = []
    for dt, rows, cols in SHAPES:
        dts = str(dt)[6:]
        if dts not in mods:
            mods[dts] = CudaModule(src, name_expressions=[n.format(T=_sources.DTYPES[dts][0],
                                   A=_sources.DTYPES[dts][1]) for n in NAMES], arch=_driver.device_arch(0),
                                   name="diag/norm_rows1.cu", options=["--ptxas-options=-v"])
        mod = mods[dts]
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        gb = 2 * rows * cols * x.element_size() / 1e3
        out = torch.empty_like(x)
        copy = gb / sum(per_kernel(lambda: out.copy_(x)).values())
        vecs = cols // (16 // x.element_size())
        kname = "c8" if vecs // 8 <= 256 else "c8k"
        cfg = _launch.launch_config(_launch.Plan("block", (rows,), (vecs // 8, 1), 0, 0))
        t, a = _sources.DTYPES[dts]
        y = torch.empty_like(x)
        st = torch.empty(rows, device="cuda", dtype=torch.float32)
        st2 = torch.empty_like(st)
        ln = mod.get_kernel(f"diag_layer_norm_fwd_{kname}<{t}, {a}>")
        rms = mod.get_kernel(f"diag_rms_norm_fwd_{kname}<{t}, {a}>")
        add = mod.get_kernel(f"diag_add_rms_norm_fwd_{kname}<{t}, {a}>")
        res, s_out = torch.randn_like(x), torch.empty_like(x)
        cases = {
            "layer_norm": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0],
                           lambda: (ln.launch(cfg, x, w, b, y, st, st2, rows, cols, 1e-5, 1, 1), y)[1],
                           torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False),
                           (x, w, b), layer_norm_forward and (lambda: layer_norm_forward(x, w, b, 1e-5))),
            "rms_norm": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0],
                         lambda: (rms.launch(cfg, x, w, y, st, rows, cols, 1e-6, 1), y)[1],
                         torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False), (x, w),
                         layer_norm_forward and (lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None))),
            "add_rms_norm": (lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6)[0],
                             lambda: (add.launch(cfg, x, res, w, y, s_out, st, rows, cols, 1e-6, 1), y)[1],
                             torch.compile(_add_rms, dynamic=False),
                             (x, res, w), layer_norm_forward and (
                                 lambda: fused_add_rms_norm_forward(x, res, w, 1e-6, 0.0, "llama"))),
        }
        torch._dynamo.reset()
        for op, (ours, one, comp, comp_args, liger) in cases.items():
            ours = _l2_rows(ours)
            torch.testing.assert_close(one().clone(), ours(), rtol=2e-2, atol=2e-2)
            k = 2 if op == "add_rms_norm" else 1  # its bytes: x and the residual read, y and s written
            rec = {"op": op, "dtype": dts, "rows": rows, "cols": cols, "copy": copy, "kernel": kname,
                   "l2_rows": k * gb / sum(per_kernel(ours).values()),
                   "one_pass": k * gb / sum(per_kernel(one).values()),
                   "compile": 0.0 if args.no_compile else k * gb / sum(
                       per_kernel(lambda: comp(*comp_args)).values())}
            if liger:
                rec["liger"] = k * gb / sum(per_kernel(liger).values())
            records.append(rec)
            print(f"{op:<10} {dts:<8} {rows:>5}x{cols:<5} GB/s L2 rows {rec['l2_rows']:5.0f} one pass ({kname}) "
                  f"{rec['one_pass']:5.0f} ({rec['one_pass'] / rec['l2_rows']:5.3f}x) | compile {rec['compile']:5.0f}"
                  f" liger {rec.get('liger', 0):5.0f} copy {copy:5.0f}", flush=True)
    regs = [line for line in mods[next(iter(mods))].binary.log.splitlines() if "registers" in line or "spill" in line]
    print("\n".join(regs[:16]))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "records": records}, indent=1))


if __name__ == "__main__":
    main()
