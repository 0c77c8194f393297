"""silu_and_mul / gelu_and_mul(tanh) bf16 on the packed input, forward and backward, as shipped (the one-vector
kernels over the whole grid) against the loop kernels on the whole grid and on persistent grids of k blocks an SM
(k = 2..6: each thread then takes rows / (k * SMs * ty) rows); Liger's forward and backward beside. L2 flushed,
opsmith.ops.benchmark, median of 50, 3 rounds in turn; GB/s of the floor (fwd 3, bwd 5 arrays of [rows, d])."""
import json, os, statistics
import torch
from opsmith import ops
from opsmith.ops import _functional as fn, _launch, _launch_gated as lg
from liger_kernel.ops.swiglu import swiglu_backward
from liger_kernel.ops.geglu import geglu_backward
from liger_kernel.transformers import functional as lf

orig_plan, orig_one = lg.gated_plan, lg.gated_one
SM = _launch.device_props(0).sm_count
state = {"k": None, "loop": False}


def plan(rows, d, itemsize, props, act="silu"):
    p = orig_plan(rows, d, itemsize, props, act)
    if state["k"] is None:
        return p
    gx, gy = p.grid
    return p._replace(grid=(gx, min(gy, -(-state["k"] * SM // gx))))


lg.gated_plan = plan
lg.gated_one = lambda *a: False if state["loop"] else orig_one(*a)
VARIANTS = {"shipped": (None, False), "loop full": (None, True), **{f"persist {k}": (k, True) for k in (2, 3, 4, 5, 6)}}
out = []
for rows, d in ((4096, 4096), (16384, 4096), (32768, 8192), (65536, 8192)):
    x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    a, b = x[:, :d].contiguous(), x[:, d:].contiguous()
    for act in ("silu", "gelu_tanh"):
        ref_y = fn.gated_fwd(act, x); ref_dx = fn.gated_bwd(act, g, x)
        calls = {}
        for name, (k, loop) in VARIANTS.items():
            def f(k=k, loop=loop):
                state["k"], state["loop"] = k, loop
                return fn.gated_fwd(act, x)

            def bw(k=k, loop=loop):
                state["k"], state["loop"] = k, loop
                return fn.gated_bwd(act, g, x)
            assert torch.equal(f(), ref_y) and torch.equal(bw(), ref_dx), (name, act)
            calls[f"{name} fwd"], calls[f"{name} bwd"] = f, bw
        state["k"], state["loop"] = None, False
        if act == "silu":
            calls["liger fwd"] = lambda: lf.liger_swiglu(a, b)
            a2, b2 = a.clone(), b.clone()
            calls["liger bwd"] = lambda: swiglu_backward(a2, b2, g)
        else:
            calls["liger fwd"] = lambda: lf.liger_geglu(a, b)
            a2, b2 = a.clone(), b.clone()
            calls["liger bwd"] = lambda: geglu_backward(a2, b2, g)
        per = {n: [] for n in calls}
        for r in range(3):
            for n in list(calls)[r:] + list(calls)[:r]:
                per[n].append(ops.benchmark(calls[n], runs=50).median_ms * 1e3)
                state["k"], state["loop"] = None, False
        for n, us in per.items():
            med = statistics.median(us)
            arrays = 3 if n.endswith("fwd") else 5
            gbps = arrays * rows * d * 2 / med / 1e3
            out.append({"shape": [rows, d], "act": act, "variant": n, "us": med, "gbps": gbps, "rounds_us": us})
            print(f"{act:9} {rows}x{d} {n:16} {med:8.1f} us {gbps:6.0f} GB/s  rounds {[round(u, 1) for u in us]}",
                  flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "gated_persist.json"), "w"), indent=1)
