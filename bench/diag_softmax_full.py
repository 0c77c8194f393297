#!/usr/bin/env python3
"""softmax's forward on narrow rows (bench_ops.py's one row slower than eager: 1x64 bf16, 1.01-1.02x, about 0.1
us) with softmax_fwd_full, the kernel of the unchecked row alone (shipped since this script's first run,
bench/results/ops-hints-h100-2026-11-27/softmax_full.json: 1x64 4.86 -> 4.70 us, eager 4.74), against softmax_fwd,
which compiles three row modes (the element one out of line, with a stack) and picks one at run time: after the L2
flush its code may come from DRAM, and the smaller kernel has less of it to fetch. Both kernels compiled from
softmax.cu under the shipped plan, the op (fn.softmax_cuda, which now takes the full kernel) and torch eager: the
call's GPU time with the L2 flushed (opsmith.ops.benchmark, as bench_ops.py), each result checked against
softmax_fwd's; and the two kernels' registers (ptxas). Every shape below fills its threads' chunks exactly (the
only rows the full kernel may take). Needs a GPU.

    python3 bench/diag_softmax_full.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch, _sources  # noqa: E402

SHAPES = [(1, 64), (64, 64), (1024, 64), (1, 128), (1024, 128), (1, 256), (1024, 256), (1, 512)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    t = _sources.DTYPES["bfloat16"][0]
    mod = CudaModule(_sources.KERNEL_DIR / "softmax.cu",
                     name_expressions=[f"softmax_fwd_full<{t}>", f"softmax_fwd<{t}>"],
                     arch=_driver.device_arch(0), name="diag/softmax_full.cu", options=["--ptxas-options=-v"])
    full, three = mod.get_kernel(f"softmax_fwd_full<{t}>"), mod.get_kernel(f"softmax_fwd<{t}>")
    log = [ln for ln in mod.binary.log.splitlines() if "Compiling entry" in ln or "Used" in ln]
    records = []
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        y, y3 = torch.empty_like(x), torch.empty_like(x)
        plan = _launch.softmax_plan(rows, cols, 2, 1, _launch.device_props(0))
        if not _launch.full_rows(plan, cols, 2, True):
            continue  # not a whole-chunk register row: the full kernel may not take it
        cfg = _launch.launch_config(plan)
        three.launch(cfg, x, y3, rows, cols)
        full.launch(cfg, x, y, rows, cols)
        torch.testing.assert_close(y, y3, rtol=0, atol=0)
        torch.testing.assert_close(fn.softmax_cuda(x, -1), y3, rtol=0, atol=0)
        nbytes = 2 * x.nbytes
        us = {"op": ops.benchmark(lambda: fn.softmax_cuda(x, -1), bytes_moved=nbytes, runs=300).median_ms,
              "three": ops.benchmark(lambda: three.launch(cfg, x, y3, rows, cols), bytes_moved=nbytes,
                                     runs=300).median_ms,
              "full": ops.benchmark(lambda: full.launch(cfg, x, y, rows, cols), bytes_moved=nbytes,
                                    runs=300).median_ms,
              "eager": ops.benchmark(lambda: torch.softmax(x, -1), bytes_moved=nbytes, runs=300).median_ms}
        us = {k: v * 1e3 for k, v in us.items()}
        records.append({"rows": rows, "cols": cols, "plan": [plan.strategy, plan.block], "us": us})
        print(f"softmax fwd {rows:>5}x{cols:<4} us: op {us['op']:.2f}, softmax_fwd {us['three']:.2f}, "
              f"full {us['full']:.2f}, eager {us['eager']:.2f}", flush=True)
    print("\n".join(log))
    write_records(args.json, records)


if __name__ == "__main__":
    main()
