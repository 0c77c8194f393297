#!/usr/bin/env python3
"""The small norm backwards that bench_ops.py lists as slower than torch eager (bf16, 64 to 1,024 rows of
512 to 4,096): each implementation's CUDA kernels and their GPU time a call (torch.profiler), and the whole
call's GPU time as bench_ops.py measures it (opsmith.ops.benchmark: CUDA events, L2 flushed, host hidden),
for opsmith.ops' layer_norm and rms_norm (autograd.grad over a graph built once, as bench_ops.py) and torch
eager's. Needs a GPU.

    python3 bench/diag_small_bwd.py [--json FILE]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from _kernel_timing import write_records  # noqa: E402  (bench/, this script's folder)
from diag_norm_split import per_kernel  # noqa: E402
from opsmith import ops  # noqa: E402

SHAPES = [(64, 512), (64, 1024), (256, 1024), (1024, 512), (1024, 1024), (1024, 4096), (64, 4096)]


def cases(rows, cols, dt):
    x = torch.randn(rows, cols, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
    b = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(rows, cols, device="cuda", dtype=dt)
    out = {}
    for name, f, params in (("layer_norm", lambda m: m(x, (cols,), w, b, 1e-5), (x, w, b)),
                            ("rms_norm", lambda m: m(x, (cols,), w, 1e-6), (x, w))):
        for impl, m in (("opsmith", getattr(ops, name)), ("eager", getattr(F, name))):
            y = f(m)
            out[(name, impl)] = (lambda y=y, p=params: torch.autograd.grad(y, p, g, retain_graph=True))
    return out, x.numel() * x.element_size()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    records = []
    for rows, cols in SHAPES:
        fns, nbytes = cases(rows, cols, torch.bfloat16)
        for (name, impl), f in fns.items():
            kernels = per_kernel(f)
            r = ops.benchmark(f, bytes_moved=3 * nbytes)
            rec = {"op": name, "impl": impl, "rows": rows, "cols": cols, "event_us": r.median_ms * 1e3,
                   "kernels_us": kernels}
            records.append(rec)
            ks = ", ".join(f"{k} {v:.2f}" for k, v in kernels.items())
            print(f"{name:<10} bwd {rows:>5}x{cols:<5} {impl:<8} {r.median_ms * 1e3:7.2f} us (events) | {ks}", flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
