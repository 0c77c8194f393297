#!/usr/bin/env python3
"""add_rms_norm's forward on its register rows (2-byte rows up to 16 KiB) where it still trails Liger-Kernel:
512x1024 0.97x, 2048x2048 0.99x (bench/results/ops-c8-h100-2026-11-27/peers-table.txt). fused_norm.cu's
add_rms_norm_fwd compiles three row modes (the element one out of line) and picks one at run time; softmax's
forward gained 0.07-0.16 us a call from a kernel of the unchecked row alone (softmax_fwd_full). Here, bf16, L2
flushed (opsmith.ops.benchmark, median of 300), GB/s of the bytes-moved floor (x and the residual read, y and s
written): the shipped op, ``diag_add_rms_full<2>`` (the unchecked row alone, 2 chunks a thread: the shipped plan; shipped since as
add_rms_norm_fwd_full, which the op now takes on these rows: bench/results/ops-hints-h100-2026-11-27/),
``diag_add_rms_full<1>`` (1 chunk, twice the threads a row, where they fit 512), Liger's fused_add_rms_norm forward
and a same-size copy; each kernel's outputs checked against the op's. Needs a GPU; Liger is optional. Commit bb2f4b0's
version also timed the row with the weight read after the reduction and with fewer shuffles in the reduce: no gain
(bench/results/ops-ln-late2-h100-2026-11-27/).

    python3 bench/diag_add_rms_full.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import beside_kernels, copy_gbps, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _fused, _launch, _sources  # noqa: E402

try:
    from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
except ImportError:
    fused_add_rms_norm_forward = None

EXTRA = """
#include "fused_norm.cu"
template <int CC, class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
diag_add_rms_full(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                  T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                  A eps, int has_w) {
    add_rms_norm_fwd_row<ROW_FULL, T, A, CC>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}
"""
SHAPES = [(512, 1024), (2048, 1024), (65536, 1024), (512, 2048), (2048, 2048), (4096, 4096), (16384, 4096),
          (1024, 8192)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    t, a = _sources.DTYPES["bfloat16"]
    names = [f"diag_add_rms_full<{c}, {t}, {a}>" for c in (2, 1)]
    mod = CudaModule(beside_kernels("add_rms_full.cu", EXTRA), name_expressions=names, arch=_driver.device_arch(0),
                     name="diag/add_rms_full.cu", options=["--ptxas-options=-v"])
    log = [ln for ln in mod.binary.log.splitlines() if "Compiling entry" in ln or "Used" in ln]
    records = []
    for rows, cols in SHAPES:
        x, res = (torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
        y, s = torch.empty_like(x), torch.empty_like(x)
        st = torch.empty(rows, device="cuda", dtype=torch.float32)
        want = _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6)
        nbytes = 4 * x.nbytes
        rec = {"rows": rows, "cols": cols,
               "op": ops.benchmark(lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6), bytes_moved=nbytes,
                                   runs=300).gbps}
        for c, name in zip((2, 1), names):
            tpr = cols // 8 // c
            if tpr > _launch.ROW_THREADS:
                continue
            cfg = _launch.launch_config(_launch.Plan("block", (rows,), (tpr, 1), 0, 0))
            k = mod.get_kernel(name)
            launch = (lambda k=k, cfg=cfg: k.launch(cfg, x, res, w, y, s, st, rows, cols, 1e-6, 1))
            launch()
            tol = 0 if c == 2 else 1e-2  # 1 chunk: another summation order (rstd and y within rounding)
            for got, exp in ((y, want[0]), (s, want[1]), (st, want[2])):
                torch.testing.assert_close(got, exp, rtol=tol, atol=tol)
            rec[f"full{c}"] = ops.benchmark(launch, bytes_moved=nbytes, runs=300).gbps
        if fused_add_rms_norm_forward is not None:
            rec["liger"] = ops.benchmark(lambda: fused_add_rms_norm_forward(x, res, w, 1e-6, 0.0, "llama"),
                                         bytes_moved=nbytes, runs=300).gbps
        rec["copy"] = copy_gbps(2 * x.nbytes)
        records.append(rec)
        print(f"add_rms_norm fwd {rows:>5}x{cols:<5} GB/s " + " ".join(
            f"{k} {v:5.0f}" for k, v in rec.items() if k not in ("rows", "cols")), flush=True)
    print("\n".join(log))
    write_records(args.json, records)


if __name__ == "__main__":
    main()
