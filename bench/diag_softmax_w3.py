#!/usr/bin/env python3
"""softmax's 16-bit forward on rows of 2 to 16 KiB (the "wide" plan at 4 chunks a thread, 32 to 256 threads a
row): softmax_fwd_wide as shipped (up to 64 registers: 1,024 threads an SM) against the 3-blocks-an-SM kernels
(softmax_fwd_wide3 / _full: 40 registers, the exps computed twice, up to 2,048 threads an SM at these block
sizes) under the same plan, through opsmith.ops' Python implementation (the kernel choice patched
in-process), GB/s with the L2 flushed (opsmith.ops.benchmark), beside Liger-Kernel's softmax forward where it
imports and a copy of the same bytes; outputs compared. Needs a GPU.

    python3 bench/diag_softmax_w3.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import copy_gbps, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch  # noqa: E402

try:
    from liger_kernel.ops.softmax import _softmax_forward
except ImportError:
    _softmax_forward = None

SHAPES = [(2048, 2048), (16384, 2048), (4096, 4096), (16384, 4096), (65536, 1024), (8192, 8192), (32768, 8192)]
W3 = _launch.softmax_fwd_wide3


def w3_everywhere(plan, cols, itemsize, aligned):
    if plan.strategy != "wide" or plan.block[0] > _launch.WIDE3_THREADS or itemsize not in (2, 4):
        return None
    full = aligned and cols == plan.block[0] * _launch.WIDE_CHUNKS * (16 // itemsize)
    return "softmax_fwd_wide3_full" if full else "softmax_fwd_wide3"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    records = []
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 3
        n = x.numel() * x.element_size()
        gbps = {"copy": copy_gbps(n)}
        got = {}
        for which in ("wide", "wide3", "wide again", "wide3 again"):
            _launch.softmax_fwd_wide3 = w3_everywhere if which.startswith("wide3") else W3
            try:
                got[which.split()[0]] = fn.softmax_cuda(x, -1)
                r = ops.benchmark(lambda: fn.softmax_cuda(x, -1), bytes_moved=2 * n).gbps
                gbps[which.split()[0]] = max(gbps.get(which.split()[0], 0), r)
            finally:
                _launch.softmax_fwd_wide3 = W3
        if _softmax_forward is not None:
            gbps["liger"] = ops.benchmark(lambda: _softmax_forward(x), bytes_moved=2 * n).gbps
        diff = (got["wide"].float() - got["wide3"].float()).abs().max().item()
        plan = _launch.softmax_plan(rows, cols, 2, 1, _launch.device_props(0))
        records.append({"rows": rows, "cols": cols, "plan": list(plan), "gbps": gbps, "max_abs_diff": diff})
        print(f"softmax fwd bf16 {rows:>6}x{cols:<5} tpr {plan.block[0]:>4}: wide {gbps['wide']:5.0f}  wide3 "
              f"{gbps['wide3']:5.0f} ({gbps['wide3'] / gbps['wide']:.3f}x)" + (
                  f"  liger {gbps['liger']:5.0f}" if "liger" in gbps else "") + f"  copy {gbps['copy']:5.0f}  "
              f"|diff| {diff:.3g}", flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
