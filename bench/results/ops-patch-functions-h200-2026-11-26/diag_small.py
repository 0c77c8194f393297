import sys, torch
sys.path.insert(0, ".")
import opsmith.ops as O
from torch.profiler import profile, ProfilerActivity
import torch.nn.functional as F
dt = torch.bfloat16
for rows, cols in ((512, 1024), (2048, 2048)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
    b = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(rows, cols, device="cuda", dtype=dt)
    cases = {"ln ours": lambda: O.layer_norm(x, (cols,), w, b), "ln eager": lambda: F.layer_norm(x, (cols,), w, b),
             "rms ours": lambda: O.rms_norm(x, (cols,), w, 1e-6), "rms eager": lambda: F.rms_norm(x, (cols,), w, 1e-6)}
    for name, f in cases.items():
        def step():
            torch.autograd.grad(f(), (x, w, b) if name.startswith("ln") else (x, w), g)
        for _ in range(5): step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(20): step()
            torch.cuda.synchronize()
        ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        tot = sum(e.device_time for e in ev) / 20
        print(f"{rows}x{cols} {name}: {tot:.1f} us kernels/step")
        agg = {}
        for e in ev:
            k = e.name[:70]; agg.setdefault(k, []).append(e.device_time)
        for k, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
            print(f"     {sum(v)/20:7.2f} us x{len(v)//20}  {k}")
        # launch configs from the trace
    # the plan our LN backward uses
from opsmith.ops import _norms, _launch
for rows, cols in ((512, 1024), (2048, 2048)):
    xx = torch.empty(rows, cols, device="cuda", dtype=dt)
    print(rows, cols, "fwd", _norms._fwd_plan(rows, cols, xx))
    print(rows, cols, "bwd", _norms._bwd_plan(rows, cols, xx))
