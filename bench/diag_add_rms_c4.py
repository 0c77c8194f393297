#!/usr/bin/env python3
"""add_rms_norm's forward on rows of 2 to 16 KiB: fused_norm.cu's add_rms_norm_fwd_c4 (norm_c4_plan's rows, 4
chunks a thread, as rms_norm_fwd_c4) against the register rows before it (add_rms_norm_fwd, 2 chunks: the plan
patched away), Liger-Kernel's fused_add_rms_norm_forward and a copy of the same bytes; GB/s of the bytes-moved
floor (x and the residual read, y and the new residual written) with the L2 flushed (opsmith.ops.benchmark, median
of 100), through opsmith.ops' Python implementation (_fused.add_rms_norm_cuda); each result checked against the
2-chunk rows'. Needs a GPU; Liger is optional (PYTHONPATH to its wheel's files).

    python3 bench/diag_add_rms_c4.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import copy_gbps, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith.ops import _fused, _launch_norm  # noqa: E402

try:
    from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
except ImportError:
    fused_add_rms_norm_forward = None

SHAPES = [(torch.bfloat16, r, c) for r, c in ((2048, 2048), (16384, 2048), (4096, 4096), (16384, 4096),
                                               (65536, 1024), (4096, 8192), (8192, 8192))]
SHAPES += [(torch.float16, 16384, 4096)]


def _two_chunks(f):
    """f with norm_c4_plan declined: add_rms_norm's 2-chunk register rows, as before the 4-chunk ones."""
    def run():
        c4 = _launch_norm.norm_c4_plan
        _launch_norm.norm_c4_plan = lambda *a: None
        try:
            return f()
        finally:
            _launch_norm.norm_c4_plan = c4
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt)
        res, w = torch.randn_like(x), torch.randn(cols, device="cuda", dtype=dt)
        moved = 4 * x.nbytes
        ours = lambda x=x, res=res, w=w, c=cols: _fused.add_rms_norm_cuda(x, res, [c], w, 1e-6)  # noqa: E731
        before = _two_chunks(ours)
        for a, b in zip(ours(), before()):
            torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
        rec = {"dtype": str(dt)[6:], "rows": rows, "cols": cols, "copy": copy_gbps(2 * x.nbytes),
               "c4": ops.benchmark(ours, bytes_moved=moved).gbps,
               "two_chunks": ops.benchmark(before, bytes_moved=moved).gbps}
        if fused_add_rms_norm_forward is not None:
            rec["liger"] = ops.benchmark(lambda: fused_add_rms_norm_forward(x, res, w, 1e-6, 0.0, "llama"),
                                         bytes_moved=moved).gbps
        records.append(rec)
        print(f"{rec['dtype']:<8} {rows:>5}x{cols:<5} GB/s 2 chunks {rec['two_chunks']:5.0f} -> 4 chunks "
              f"{rec['c4']:5.0f} ({rec['c4'] / rec['two_chunks']:.3f}x) | liger {rec.get('liger', 0):5.0f} "
              f"copy {rec['copy']:5.0f}", flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
