#!/usr/bin/env python3
"""The norm backwards, kernels alone (torch.profiler, us a call, per kernel): the plan that
``_launch_bwd.norm_bwd_plan`` picks beside the persistent kernel (its partial sums, a row a block) and
"split" (norm_split.cu's grad_x, then norm_bwd_weight, its clusters where the plan takes them, and
without: "split_columns") forced, and eager torch's backward
(autograd.grad of F.layer_norm / F.rms_norm). Needs a GPU.

    python3 bench/diag_norm_split.py [--out FILE.json]
"""
import argparse
import functools
import json
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import per_kernel  # noqa: E402,F401  (bench/; diag scripts import it from here too)
from opsmith.ops import _launch, _launch_bwd, _norms  # noqa: E402

SHAPES = [(torch.bfloat16, r, c) for r, c in (
    (1, 4096), (16, 4096), (64, 4096), (256, 4096), (1024, 4096), (2048, 4096), (4096, 4096), (64, 8192), (128, 8192),
    (256, 8192), (1024, 8192), (2048, 8192), (512, 1024), (1024, 1024), (1024, 2048), (2048, 2048), (4096, 2048))]
SHAPES += [(torch.float32, r, c) for r, c in ((64, 4096), (256, 4096), (1024, 4096), (2048, 2048))]
SHAPES += [(torch.float16, 1024, 4096)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    orig, orig_w = _launch_bwd.norm_bwd_plan, _launch_bwd.weight_grad_plan
    props = _launch.device_props(0)
    resident = min(_launch.ROW_THREADS * _launch.ROW_BWD_BLOCKS, props.max_threads_per_sm)
    records = []
    for dt, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dt, requires_grad=True)
        w = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
        g = torch.randn(rows, cols, device="cuda", dtype=dt)
        xd, wd = x.detach(), w.detach()
        _, mean, rstd = _norms.layer_norm_fwd(xd, [cols], wd, wd, 1e-5)
        _, rrstd = _norms.rms_norm_fwd(xd, [cols], wd, 1e-6)
        rec = {"dtype": str(dt)[6:], "rows": rows, "cols": cols}
        for op, arrays in (("layer_norm", 2), ("rms_norm", 1)):
            plan = orig(rows, cols, x.element_size(), props, arrays)
            tpr, pb = plan.block
            pgrid = max(1, min(max(1, resident // (tpr * pb)) * props.sm_count, -(-rows // (2 * pb))))
            forced = {"plan": plan, "persistent": _launch.Plan("persistent", (pgrid,), plan.block, 0, 0),
                      "split": _launch.Plan("split", (-(-rows // pb),), plan.block, 0, 0)}
            call = functools.partial(_norms.layer_norm_bwd, g, xd, [cols], mean, rstd, True, True, wd) \
                if op == "layer_norm" else functools.partial(_norms.rms_norm_bwd, g, xd, [cols], rrstd, True, wd)
            rec[op] = {"strategy": plan.strategy}
            for label, p in forced.items():
                _launch_bwd.norm_bwd_plan = lambda *a, p=p: p
                rec[op][label] = per_kernel(call)
            # split, norm_bwd_weight without clusters (its chunks' partial sums, then norm_col_sum)
            _launch_bwd.weight_grad_plan = lambda r, c, i, pr: orig_w(r, c, i, pr._replace(clusters=False))
            rec[op]["split_columns"] = per_kernel(call)
            _launch_bwd.norm_bwd_plan, _launch_bwd.weight_grad_plan = orig, orig_w
            y = torch.nn.functional.layer_norm(x, (cols,), w, w) if op == "layer_norm" \
                else torch.nn.functional.rms_norm(x, (cols,), w)
            rec[op]["eager"] = per_kernel(functools.partial(torch.autograd.grad, y, (x, w), g, retain_graph=True))
            tot = {k: sum(v.values()) for k, v in rec[op].items() if k != "strategy"}
            print(f"{rec['dtype']:8} {rows:5}x{cols:<5} {op:10} {plan.strategy:10} plan {tot['plan']:6.2f} | persist "
                  f"{tot['persistent']:6.2f} | split {tot['split']:6.2f} (columns {tot['split_columns']:6.2f}) | "
                  f"eager {tot['eager']:6.2f} | "
                  f"eager/plan {tot['eager'] / tot['plan']:.2f}", flush=True)
        records.append(rec)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "unit": "us a call, kernels alone", "rows": records},
                      f, indent=1)


if __name__ == "__main__":
    main()
