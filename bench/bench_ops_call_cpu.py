"""Per-call cost of the opsmith.ops public functions against torch's, on a small CPU tensor.

A wrapper-cost check that needs no GPU: both sides run CPU kernels (ours torch's own code, or
the formula for rms_norm), so the difference is the Python wrapper and the op call, plus the
kernels' difference. Median of --rounds paired differences (ours, then torch's, per round).

    python bench/bench_ops_call_cpu.py
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from opsmith import ops


def per_call_us(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    x, w = torch.randn(1, 64), torch.ones(64)
    F = torch.nn.functional
    cases = {
        "relu": (lambda: ops.relu(x), lambda: torch.relu(x)),
        "gelu": (lambda: ops.gelu(x), lambda: F.gelu(x)),
        "softmax": (lambda: ops.softmax(x, -1), lambda: torch.softmax(x, -1)),
        "rms_norm": (lambda: ops.rms_norm(x, (64,), w, 1e-6), lambda: F.rms_norm(x, (64,), w, 1e-6)),
        "layer_norm": (lambda: ops.layer_norm(x, (64,), w), lambda: F.layer_norm(x, (64,), w)),
    }
    for ours, theirs in cases.values():
        per_call_us(ours, 500), per_call_us(theirs, 500)  # warm-up (and the ops' registration)
    diffs = {k: [] for k in cases}
    for _ in range(a.rounds):
        for k, (ours, theirs) in cases.items():
            diffs[k].append(per_call_us(ours, a.calls) - per_call_us(theirs, a.calls))
    print(f"opsmith.ops - torch, us per call, (1, 64) float32 CPU tensor, median of {a.rounds} paired rounds:")
    print("  " + ", ".join(f"{k} {statistics.median(v):+.2f}" for k, v in diffs.items()))


if __name__ == "__main__":
    main()
