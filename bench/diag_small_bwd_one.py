#!/usr/bin/env python3
"""The norm backwards of few rows in one launch (norm_small.cu, _launch_bwd.norm_bwd_small_plan's "small")
against the plans without it (the persistent backward and norm_col_sum, or the "split" grad_x and
norm_bwd_weight) and torch eager's backward, through opsmith.ops' Python implementations (the row limit
SMALL_BWD_ROWS patched in-process: "small" takes every row count its width allows, "without" none), bf16 and
float rows of 512 to 4,096 from 2 to 4,096 rows. Kernels alone (torch.profiler, us a call, their sum) and the
call's GPU time with the L2 flushed (opsmith.ops.benchmark); the "small" gradients checked against the others.
Needs a GPU.

    python3 bench/diag_small_bwd_one.py [--json FILE] [--dtypes bfloat16,float32]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import write_records  # noqa: E402  (bench/, this script's folder)
from diag_norm_split import per_kernel  # noqa: E402
from diag_small_bwd_plans import norm_bwd_cases  # noqa: E402
from opsmith import ops  # noqa: E402
from opsmith.ops import _launch, _launch_bwd  # noqa: E402

ROWS = (2, 16, 64, 256, 512, 1024, 2048, 4096)
COLS = (512, 1024, 2048, 4096)
SHIPPED = _launch_bwd.SMALL_BWD_ROWS


def limit(rows: int) -> None:
    _launch_bwd.SMALL_BWD_ROWS = rows
    _launch_bwd.norm_bwd_small_plan.cache_clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    records = []
    for dt in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for cols in COLS:
            for rows in ROWS:
                x, cases = norm_bwd_cases(rows, cols, dt)
                limit(1 << 30)
                has_small = _launch_bwd.norm_bwd_small_plan(rows, cols, x.element_size(),
                                                            _launch.device_props(x.get_device())) is not None
                limit(SHIPPED)
                for op, (ours, eager) in cases.items():
                    out = {}
                    for variant in ("small", "without", "eager") if has_small else ("without", "eager"):
                        f = eager if variant == "eager" else ours
                        limit(1 << 30 if variant == "small" else 0)
                        try:
                            got = f()
                            if variant == "small":
                                small = got
                            elif variant == "without" and has_small:
                                for a, e in zip(small, got):
                                    torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2)
                            ks = per_kernel(f)
                            us = ops.benchmark(f, bytes_moved=3 * x.numel() * x.element_size()).median_ms * 1e3
                        finally:
                            limit(SHIPPED)
                        out[variant] = {"event_us": us, "kernels_us": ks}
                    records.append({"op": op, "dtype": str(dt).split(".")[1], "rows": rows, "cols": cols,
                                    "variants": out})
                    print(f"{op:<10} {str(dt)[6:]:<8} {rows:>5}x{cols:<5} " + " | ".join(
                        f"{v} {r['event_us']:6.2f} ({sum(r['kernels_us'].values()):5.2f} in {len(r['kernels_us'])})"
                        for v, r in out.items()), flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
