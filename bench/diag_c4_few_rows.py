#!/usr/bin/env python3
"""The norm forwards' 4-chunk rows (``_launch_norm.norm_c4_plan``: layer_norm_fwd_c4, rms_norm_fwd_c4, 2-byte
rows of 2 to 16 KiB) on few rows, where bench_ops.py found rms_norm bf16 1024x1024 1.05x torch eager's time in
one run (0.95-0.97x in two earlier ones): the op as shipped against the register rows of 2 chunks a thread
(norm_c4_plan patched to decline, as before it) and torch eager, GB/s of the bytes-moved floor, L2 flushed
(opsmith.ops.benchmark, median of 300, three times each, alternating). Needs a GPU.

    python3 bench/diag_c4_few_rows.py [--json FILE]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from _kernel_timing import write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith.ops import _launch_norm, _norms  # noqa: E402

SHAPES = [(256, 1024), (512, 1024), (1024, 1024), (2048, 1024), (8192, 1024), (1024, 2048), (1024, 4096),
          (4096, 4096)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    c4 = _launch_norm.norm_c4_plan
    records = []
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        w, b = torch.randn(cols, device="cuda", dtype=x.dtype), torch.randn(cols, device="cuda", dtype=x.dtype)
        nbytes = 2 * x.nbytes
        cases = {"rms_norm": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0],
                              lambda: F.rms_norm(x, (cols,), w, 1e-6)),
                 "layer_norm": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0],
                                lambda: F.layer_norm(x, (cols,), w, b, 1e-5))}
        for op, (ours, eager) in cases.items():
            rec = {"op": op, "rows": rows, "cols": cols, "c4": [], "c2": [], "eager": []}
            for _ in range(3):
                for label in ("c4", "c2"):
                    _launch_norm.norm_c4_plan = c4 if label == "c4" else (lambda *a: None)
                    try:
                        rec[label].append(ops.benchmark(ours, bytes_moved=nbytes, runs=300).gbps)
                    finally:
                        _launch_norm.norm_c4_plan = c4
                rec["eager"].append(ops.benchmark(eager, bytes_moved=nbytes, runs=300).gbps)
            records.append(rec)
            print(f"{op:<10} {rows:>5}x{cols:<5} GB/s " + "  ".join(
                f"{k} " + "/".join(f"{v:5.0f}" for v in rec[k]) for k in ("c4", "c2", "eager")), flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
