#!/usr/bin/env python3
"""The norm forwards of 4 chunks a thread (``_launch_norm.norm_c4_plan``) on rows that are whole warps of 4 chunks
fewer than its power of two (bf16 3,072, 5,120, 6,144 columns: 96, 160, 192 threads, not 128, 256, 256), kernels
alone (torch.profiler, the L2 flushed before each call), us: the plan as shipped beside the plan at exactly those
threads (each row then fills its threads' chunks: the unchecked c4 kernels), outputs compared. A lead for the norms
of softmax's ``_launch._whole_warps``, not shipped. Needs a GPU.

    python3 bench/diag_norm_whole_warps.py [--out FILE.json]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import per_kernel, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith.ops import _launch, _launch_norm, _norms  # noqa: E402

SHAPES = [(torch.bfloat16, r, c) for r, c in ((16384, 3072), (4096, 5120), (16384, 5120), (4096, 6144),
                                               (16384, 6144), (8192, 8192))]
SHAPES += [(torch.float32, 16384, 3072)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    orig = _launch_norm.norm_c4_plan

    def exact(rows, cols, itemsize, props, arrays=2):
        p = orig(rows, cols, itemsize, props, arrays)
        t, rem = divmod(cols, 4 * (16 // itemsize))
        return p._replace(block=(t, 1)) if p is not None and not rem and t % 32 == 0 and t < p.block[0] else p

    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt)
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        calls = {"layer_norm": lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5),
                 "rms_norm": lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)}
        for op, call in calls.items():
            rec = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols}
            for name, plan in (("shipped", orig), ("whole_warps", exact)):
                _launch_norm.norm_c4_plan = plan
                try:
                    rec[f"{name}_us"] = sum(per_kernel(call, 20, flush=True).values())
                    rec[f"{name}_plan"] = str(plan(rows, cols, x.element_size(), _launch.device_props(0),
                                                   2 if op == "layer_norm" else 1))
                    out = call()[0]
                finally:
                    _launch_norm.norm_c4_plan = orig
                rec[f"{name}_y"] = out
            rec["max_diff"] = (rec.pop("shipped_y").float() - rec.pop("whole_warps_y").float()).abs().max().item()
            rec["speedup"] = rec["shipped_us"] / rec["whole_warps_us"]
            records.append(rec)
            print(f"{op:10s} {rec['dtype']:8s} {rows}x{cols}: shipped {rec['shipped_us']:.2f} us, whole warps "
                  f"{rec['whole_warps_us']:.2f} us ({rec['speedup']:.3f}x), max diff {rec['max_diff']:.3g}", flush=True)
    write_records(args.out, records)


if __name__ == "__main__":
    main()
