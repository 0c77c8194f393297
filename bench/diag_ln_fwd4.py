#!/usr/bin/env python3
"""layer_norm's forward on float rows of 4,097-8,192 elements: norm.cu's layer_norm_fwd4 (one
block, 4 chunks a thread; the plan now) against the 2-block cluster forward (norm_cluster.cu) and
torch, kernels alone (torch.profiler, us a call, L2 warm). Needs a GPU with clusters (sm_90+).

    python3 bench/diag_ln_fwd4.py
"""
import functools
import sys

import torch

sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _launch_norm, _norms  # noqa: E402


def kernels_us(fn):
    return sum(per_kernel(fn).values())


def main():
    orig = _launch_norm.layer_norm_fwd4_plan
    for rows, cols in ((4096, 8192), (8192, 8192), (16384, 6144), (2048, 4097), (65536, 5000)):
        x = torch.randn(rows, cols, device="cuda")
        w, b = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
        fwd = functools.partial(_norms.layer_norm_fwd, x, [cols], w, b, 1e-5)
        four = kernels_us(fwd)
        y4 = fwd()[0]
        _launch_norm.layer_norm_fwd4_plan = lambda *a: None  # the clusters
        cl = kernels_us(fwd)
        ycl = fwd()[0]
        _launch_norm.layer_norm_fwd4_plan = orig
        eager = kernels_us(functools.partial(torch.nn.functional.layer_norm, x, (cols,), w, b, 1e-5))
        gb = 2 * rows * cols * 4 / 1e3
        diff = (y4 - ycl).abs().max().item()
        print(f"float32 {rows}x{cols}: fwd4 {four:7.2f} us ({gb / four:5.0f} GB/s) | clusters {cl:7.2f} "
              f"({gb / cl:5.0f}) | eager {eager:7.2f} ({gb / eager:5.0f}) | max |fwd4 - clusters| {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
