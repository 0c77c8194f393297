"""gated forwards at 1-2 GiB: ours on the packed [gate | up] input, ours on gate and up as two tensors (the
layout Liger gets), Liger's; 3 rounds in turn, median of 50, L2 flushed. GB/s of 3 x the output's bytes."""
import json, os, statistics
import torch
from opsmith import ops
from liger_kernel.transformers import functional as lf

res = []
for rows, d in ((4096, 4096), (32768, 8192), (65536, 8192)):
    x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16)
    a, b = x[:, :d].contiguous(), x[:, d:].contiguous()
    for act in ("silu", "gelu"):
        if act == "silu":
            calls = {"ours packed": lambda: ops.silu_and_mul(x), "ours split": lambda: ops.silu_mul(a, b),
                     "liger split": lambda: lf.liger_swiglu(a, b)}
        else:
            calls = {"ours packed": lambda: ops.gelu_and_mul(x, "tanh"), "ours split": lambda: ops.gelu_mul(a, b, "tanh"),
                     "liger split": lambda: lf.liger_geglu(a, b)}
        for f in calls.values():
            f()
        per = {n: [] for n in calls}
        for r in range(3):
            for n in list(calls)[r:] + list(calls)[:r]:
                per[n].append(ops.benchmark(calls[n], runs=50).median_ms * 1e3)
        for n, us in per.items():
            m = statistics.median(us)
            res.append({"shape": [rows, d], "act": act, "call": n, "us": m, "rounds": us})
            print(f"{act} {rows}x{d} {n:12} {m:8.1f} us {3 * rows * d * 2 / m / 1e3:6.0f} GB/s  rounds {[round(u, 1) for u in us]}",
                  flush=True)
json.dump({"device": torch.cuda.get_device_name(), "rows": res},
          open(os.path.join(os.environ.get("OUT", "."), "gated_layout.json"), "w"))
