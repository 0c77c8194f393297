#!/usr/bin/env python3
"""softmax's forward on rows of 64 to 256 bf16 (the rows bench_ops.py lists as 1-2 % slower than torch eager)
under other launch shapes of the same kernel (softmax.cu's softmax_fwd: tpr threads a row, rows a block), against
the shipped plan and torch eager: the call's GPU time with the L2 flushed (opsmith.ops.benchmark, as
bench_ops.py), each result checked against the shipped one. Needs a GPU.

    python3 bench/diag_softmax_narrow.py [--json FILE]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch  # noqa: E402

SHAPES = [(1, 64), (64, 64), (1024, 64), (8192, 64), (1024, 128), (1024, 256)]
TPRS = (4, 8, 16, 32)
PER_BLOCK = (4, 8, 16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    shipped = _launch.softmax_plan
    records = []
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        want = fn.softmax_cuda(x, -1)
        nbytes = 2 * x.numel() * x.element_size()
        res = {"shipped": ops.benchmark(lambda: fn.softmax_cuda(x, -1), bytes_moved=nbytes, runs=200).median_ms,
               "eager": ops.benchmark(lambda: torch.softmax(x, -1), bytes_moved=nbytes, runs=200).median_ms}
        plan = shipped(rows, cols, 2, 1, _launch.device_props(0))
        for tpr in TPRS:
            for per_block in PER_BLOCK:
                if tpr * _launch.ROW_CHUNKS * 8 < cols or tpr * per_block > 512:
                    continue
                forced = _launch.Plan(plan.strategy, (-(-rows // per_block),), (tpr, per_block), 0, 0)
                _launch.softmax_plan = lambda *a, p=forced: p  # noqa: E731
                try:
                    torch.testing.assert_close(fn.softmax_cuda(x, -1), want)
                    res[f"{tpr}x{per_block}"] = ops.benchmark(lambda: fn.softmax_cuda(x, -1), bytes_moved=nbytes,
                                                              runs=200).median_ms
                finally:
                    _launch.softmax_plan = shipped
        us = {k: v * 1e3 for k, v in res.items()}
        records.append({"rows": rows, "cols": cols, "shipped_plan": [plan.strategy, plan.block], "us": us})
        best = min((k for k in us if "x" in k), key=us.get)
        print(f"softmax fwd {rows:>5}x{cols:<4} shipped {plan.block} {us['shipped']:.2f} us, eager {us['eager']:.2f}, "
              f"best {best} {us[best]:.2f} | " + " ".join(f"{k} {v:.2f}" for k, v in us.items() if "x" in k),
              flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
