#!/usr/bin/env python3
"""Issue 23: the gated ops' forward + backward on small shapes, taken apart. The H100 sweep of 2026-12-06 had
silu_and_mul / gelu_and_mul 512x1024 forward + backward at 0.863x / 0.917x Liger-Kernel (±14 %;
bench/results/ops-h100-2026-12-06/). The step as the peers benchmark times it (one forward and one
torch.autograd.grad, the L2 flushed before each) for "ours" (the packed ``[rows, 2 d]`` op), "ours_split"
(``silu_mul`` / ``gelu_mul`` on gate and up as two tensors, as Liger takes them) and "liger": the whole step's µs
(``opsmith.ops.benchmark``, ``--rounds`` rounds in turn, the median of the rounds) and each kernel's µs in it
(torch.profiler, L2 flushed), whose sum against the step's time says how much of it is kernels and how much the
gaps between them. Needs a GPU (Liger-Kernel importable for its column).

    python3 bench/diag_gated_step.py --json gated-step.json
    python3 bench/diag_gated_step.py --shapes 512x1024,2048x2048 --acts silu
"""
import argparse
import statistics
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import per_kernel, write_records  # noqa: E402  (bench/, this script's folder)
from bench_ops_peers import _liger, prepare  # noqa: E402  (its step, built as the peers benchmark builds it)
from opsmith import ops  # noqa: E402


def impls(act: str, liger) -> dict:
    """name -> (make(rows, d, dtype, device, grad) -> leaves, fn(*leaves) -> output), as bench_ops_peers.impls."""
    packed = (lambda r, d, dt, dev, g: (torch.randn(r, 2 * d, dtype=dt, device=dev, requires_grad=g),))
    split = (lambda r, d, dt, dev, g: tuple(torch.randn(r, d, dtype=dt, device=dev, requires_grad=g)
                                            for _ in range(2)))
    out = {"ours": (packed, ops.silu_and_mul if act == "silu" else (lambda x: ops.gelu_and_mul(x, "tanh"))),
           "ours_split": (split, ops.silu_mul if act == "silu" else (lambda a, b: ops.gelu_mul(a, b, "tanh")))}
    if liger is not None:
        out["liger"] = (split, liger.liger_swiglu if act == "silu" else liger.liger_geglu)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--shapes", default="512x1024,1024x1024,2048x2048", help="ROWSxD,...")
    ap.add_argument("--acts", default="silu,gelu_tanh")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()
    liger = _liger()
    if liger is None:
        print("Liger-Kernel not importable; its column is left out", flush=True)
    records = []
    print(torch.cuda.get_device_name(), flush=True)
    for act in args.acts.split(","):
        for shape in args.shapes.split(","):
            rows, d = (int(v) for v in shape.split("x"))
            steps = {name: prepare(name, make, fn, rows, d, torch.bfloat16, "cuda", "fwd+bwd")
                     for name, (make, fn) in impls(act, liger).items()}
            names = list(steps)
            per = {n: [] for n in names}
            for r in range(args.rounds):
                for n in names[r % len(names):] + names[:r % len(names)]:
                    per[n].append(ops.benchmark(steps[n], runs=args.runs, warmup=5).median_ms * 1e3)
            line = []
            for n in names:
                kernels = per_kernel(steps[n], n=50, flush=True)
                us = statistics.median(per[n])
                records.append({"act": act, "rows": rows, "d": d, "impl": n, "step_us": us, "rounds_us": per[n],
                                "kernels_us": kernels})
                ks = " + ".join(f"{k} {v:.2f}" for k, v in kernels.items())
                line.append(f"  {n:10s} step {us:6.2f} us (spread {max(per[n]) / min(per[n]) - 1:.1%}); "
                            f"kernels {sum(kernels.values()):6.2f} us: {ks}")
            print(f"{act} {rows}x{d}:\n" + "\n".join(line), flush=True)
    write_records(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
