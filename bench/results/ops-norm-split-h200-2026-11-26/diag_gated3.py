import sys, functools, torch
sys.path.insert(0, ".")
sys.path.insert(0, "/tmp/liger")
from opsmith import ops
from opsmith.ops import _launch, _functional as fn
from torch.profiler import profile, ProfilerActivity
from liger_kernel.transformers import functional as lf
def kus(f, n=20):
    for _ in range(3): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): f()
        torch.cuda.synchronize()
    return sum(e.device_time for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA) / n
orig = _launch.gated_plan
props = _launch.device_props(0)
def plan_variant(kind):
    def f(rows, d, itemsize, pr, act="silu"):
        p = orig(rows, d, itemsize, pr, act)
        if kind == "cur":
            return p
        tx, ty = p.block
        gx = p.grid[0]
        trips, per_sm = _launch.GATED_GRID[act]
        wave = pr.sm_count * min(per_sm, max(1, pr.max_threads_per_sm // 256))
        if kind == "nofold":
            gy = _launch._cdiv(max(rows, 1), ty * _launch.GATED_ROWS * trips)
        elif kind == "rowblock":  # one row a thread-row, one trip: every row at once
            gy = _launch._cdiv(max(rows, 1), ty)
        elif kind == "2wave":
            gy = _launch._cdiv(2 * wave, gx)
        gy = min(_launch._cdiv(max(rows, 1), ty), max(gy, 1))
        return _launch.Plan("gated", (gx, min(gy, 65535)), (tx, ty), 0, 0)
    return f
for rows, d in ((2048, 2048), (4096, 4096), (65536, 1024), (16384, 4096), (8192, 8192)):
    x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16)
    a, b = x[:, :d].contiguous(), x[:, d:].contiguous()
    g = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    for act, lig in (("silu", lf.liger_swiglu), ("gelu_tanh", lf.liger_geglu)):
        out = []
        for kind in ("cur", "nofold", "rowblock", "2wave"):
            _launch.gated_plan = plan_variant(kind)
            f = kus(functools.partial(fn.gated_fwd, act, x))
            bw = kus(functools.partial(fn.gated_bwd, act, g, x))
            out.append(f"{kind} {f:6.2f}/{bw:6.2f}")
        _launch.gated_plan = orig
        la, lb = a.clone().requires_grad_(), b.clone().requires_grad_()
        lf_ = kus(lambda: lig(la, lb))
        y = lig(la, lb)
        lbw = kus(lambda: torch.autograd.grad(y, (la, lb), g, retain_graph=True))
        print(f"{rows}x{d} {act:9} " + " | ".join(out) + f" | liger {lf_:6.2f}/{lbw:6.2f}", flush=True)
