#!/usr/bin/env python3
"""softmax's forward on narrow rows (bench_ops.py's one row slower than eager: 1x64 bf16, 1.01-1.02x, about 0.1
us) with a kernel that holds the unchecked row alone. softmax.cu's softmax_fwd compiles three row modes (the
element one out of line) and picks one at run time; after the L2 flush its code may come from DRAM, and the
smaller kernel has less of it to fetch. ``softmax_fwd_full`` (compiled here from softmax.cu's row, ROW_FULL only,
the same launch bounds) under the shipped plan, against the shipped op and torch eager: the call's GPU time with
the L2 flushed (opsmith.ops.benchmark, as bench_ops.py), each result checked against the shipped one; and the
two kernels' registers (ptxas). Every shape below fills its threads' chunks exactly (the only rows the full
kernel may take). Not yet run: prepared for a stop with device time. Needs a GPU.

    python3 bench/diag_softmax_full.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import beside_kernels, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch, _sources  # noqa: E402

EXTRA = """
#include "softmax.cu"
template <class T>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 4, 4>::value))
softmax_fwd_full(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_row<ROW_FULL, OPSMITH_ROW_CHUNKS>(x, y, rows, cols);
}
"""
SHAPES = [(1, 64), (64, 64), (1024, 64), (1, 128), (1024, 128), (1, 256), (1024, 256), (1, 512)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    src = beside_kernels("softmax_full.cu", EXTRA)
    t = _sources.DTYPES["bfloat16"][0]
    mod = CudaModule(src, name_expressions=[f"softmax_fwd_full<{t}>", f"softmax_fwd<{t}>"],
                     arch=_driver.device_arch(0), name="diag/softmax_full.cu", options=["--ptxas-options=-v"])
    full = mod.get_kernel(f"softmax_fwd_full<{t}>")
    log = [ln for ln in mod.binary.log.splitlines() if "Compiling entry" in ln or "Used" in ln]
    records = []
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        want = fn.softmax_cuda(x, -1)
        plan = _launch.softmax_plan(rows, cols, 2, 1, _launch.device_props(0))
        if plan.strategy not in ("warp", "block") or cols != plan.block[0] * _launch.ROW_CHUNKS * 8:
            continue  # not a whole-chunk register row: the full kernel may not take it
        cfg = _launch.launch_config(plan)
        full.launch(cfg, x, y, rows, cols)
        torch.testing.assert_close(y, want, rtol=0, atol=0)
        nbytes = 2 * x.nbytes
        us = {"shipped": ops.benchmark(lambda: fn.softmax_cuda(x, -1), bytes_moved=nbytes, runs=300).median_ms,
              "full": ops.benchmark(lambda: full.launch(cfg, x, y, rows, cols), bytes_moved=nbytes,
                                    runs=300).median_ms,
              "eager": ops.benchmark(lambda: torch.softmax(x, -1), bytes_moved=nbytes, runs=300).median_ms}
        us = {k: v * 1e3 for k, v in us.items()}
        records.append({"rows": rows, "cols": cols, "plan": [plan.strategy, plan.block], "us": us})
        print(f"softmax fwd {rows:>5}x{cols:<4} us: shipped {us['shipped']:.2f}, full {us['full']:.2f}, "
              f"eager {us['eager']:.2f}", flush=True)
    print("\n".join(log))
    write_records(args.json, records)


if __name__ == "__main__":
    main()
