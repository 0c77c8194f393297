#!/usr/bin/env python3
"""The norm forwards on rows of exactly 16 KiB (bf16 8,192, float 4,096): the shipped L2 rows (norm_l2.cu, two
passes, the second from L2) against the register rows of 4 chunks a thread (layer_norm_fwd_c4 /
rms_norm_fwd_c4, one pass: 256 threads a row), each forced whatever the shipped plans say (norm_c4_plan takes
these rows since this script's first run; before, norm_l2_plan did). Both through
opsmith.ops' Python implementations (the plans patched in-process), GB/s of the bytes-moved floor with the L2
flushed (opsmith.ops.benchmark), beside a copy of the same bytes; outputs of the two compared. Needs a GPU.

    python3 bench/diag_fwd_16k.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import copy_gbps, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith.ops import _launch_norm, _norms  # noqa: E402

SHAPES = [(torch.bfloat16, r, 8192) for r in (2048, 4096, 8192, 32768)] + \
         [(torch.float32, r, 4096) for r in (4096, 16384, 65536)]
L2, C4 = _launch_norm.norm_l2_plan, _launch_norm.norm_c4_plan
Plan, ROW = _launch_norm.Plan, 16384


def force(mode):
    """Give rows of exactly 16 KiB to "l2" (norm_l2.cu's plan: about L2_CHUNKS chunks a thread, rms_norm's at
    least L2_RMS_THREADS threads) or "c4" (a block of 256 threads a row), whatever the shipped plans say; None
    restores them."""
    _launch_norm.norm_l2_plan, _launch_norm.norm_c4_plan = L2, C4
    if mode is None:
        return

    def ours(cols, itemsize, arrays):
        return cols * itemsize == ROW and (arrays == 2 or itemsize == 2)

    def l2(rows, cols, itemsize, props, arrays=2):
        if not ours(cols, itemsize, arrays):
            return L2(rows, cols, itemsize, props, arrays)
        if mode == "c4":
            return None
        nv = cols // (16 // itemsize)
        threads = 1 << (-(-nv // _launch_norm.L2_CHUNKS) - 1).bit_length()
        if arrays == 1:
            threads = max(threads, min(_launch_norm.L2_RMS_THREADS, 1 << (-(-nv // 2) - 1).bit_length()))
        return Plan("l2", (rows,), (min(threads, _launch_norm.L2_THREADS), 1), 0, 0)

    def c4(rows, cols, itemsize, props, arrays=2):
        if not ours(cols, itemsize, arrays):
            return C4(rows, cols, itemsize, props, arrays)
        return Plan("block", (max(1, rows),), (256, 1), 0, 0) if mode == "c4" else None
    _launch_norm.norm_l2_plan, _launch_norm.norm_c4_plan = l2, c4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        n = x.numel() * x.element_size()
        copy = copy_gbps(n)
        p = cols * x.element_size()
        cases = {"layer_norm": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0], 2 * n + 2 * p + 8 * rows)}
        if dt != torch.float32:
            cases["rms_norm"] = (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0], 2 * n + p + 4 * rows)
        for op, (f, floor) in cases.items():
            got, gbps = {}, {}
            for which in ("l2", "c4", "l2 again", "c4 again"):
                force(which[:2])
                try:
                    got[which[:2]] = f()
                    gbps[which] = ops.benchmark(f, bytes_moved=floor).gbps
                finally:
                    force(None)
            diff = (got["l2"].float() - got["c4"].float()).abs().max().item()
            best = {k: max(gbps[k], gbps[k + " again"]) for k in ("l2", "c4")}
            rec = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols, "gbps": best, "copy_gbps": copy,
                   "max_abs_diff": diff}
            records.append(rec)
            print(f"{op:<10} {rec['dtype']:<8} {rows:>6}x{cols:<5} l2 {best['l2']:5.0f}  c4 {best['c4']:5.0f} "
                  f"({best['c4'] / best['l2']:.3f}x)  same-size copy {copy:5.0f}  |diff| {diff:.3g}", flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
