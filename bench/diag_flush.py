#!/usr/bin/env python3
r"""Issue 23: does the benchmark's L2 flush leave lines that a kernel loaded under L2 evict_last?

``opsmith.ops.benchmark`` (as ``triton.testing.do_bench``) flushes the L2 cache with ``buf.zero_()`` over twice its
size: plain writes. torch.compile's rotary kernel loads q and k under ``eviction_policy='evict_last'`` (the halves
each element pairs with), and at 512x1024 float32 its forward runs 6.3 us in the sweep's timing against 7.7 us for
ours and for a copy of the same bytes, while Nsight Compute (which invalidates L2 before each kernel) times both
kernels at 5.1-5.3 us. If plain writes do not evict evict_last lines, compile's inputs are still in L2 when it runs.

Times the sweep's calls (``bench_ops_peers.prepare``: ours, compile(dynamic=False), Liger where importable, a copy)
under two flushes, the implementations in turn over ``--rounds`` rounds:

- ``zero``: the benchmark's own (``buf.zero_()``, 2x L2);
- ``last``: first a Triton kernel that reads a buffer of 2x L2 under evict_last (displacing every evict_last line
  left by the timed call before), then ``buf.zero_()``.

Equal figures under both: the flush is not what sets the ratio. Prints us and, for each implementation, its time
over ours (above 1: ours is faster).

    python3 bench/diag_flush.py --op rotary --dtype float32 --shapes 512x1024,1024x1024,2048x2048
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _flush import FLUSHES, flush_mode  # noqa: E402
from bench_ops_peers import _copy, _liger, floor_bytes, impls, measure_case, prepare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="rotary")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--shapes", default="512x1024,1024x1024,2048x2048")
    ap.add_argument("--directions", default="fwd,fwd+bwd")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    dt, dev = getattr(torch, args.dtype), torch.device("cuda")
    peers = impls(args.op, _liger())
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "op": args.op, "dtype": args.dtype,
           "cases": []}
    print(f"{out['device']}, {args.op} {args.dtype}", flush=True)
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        for direction in args.directions.split(","):
            moved = floor_bytes(args.op, rows, cols, torch.tensor([], dtype=dt).element_size(), direction)
            calls = {name: (prepare(name, make, fn, rows, cols, dt, dev, direction), moved, args.runs)
                     for name, (make, fn) in peers.items() if name != "eager"}
            calls["copy"] = (_copy(moved, dev)[0], moved, args.runs)
            for mode in FLUSHES:
                with flush_mode(mode):  # the sweep's timing: rounds in turn, the median of the rounds' medians
                    res = measure_case(calls, args.rounds, "cuda")
                us = {n: r["ms"] * 1e3 for n, r in res.items() if "ms" in r}
                out["cases"].append({"rows": rows, "cols": cols, "direction": direction, "flush": mode, "us": us})
                cells = " | ".join(f"{n} {t:7.2f} us ({t / us['opsmith']:.3f}x)" for n, t in us.items())
                print(f"{shape:>10} {direction:8} {mode:5} {cells}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
