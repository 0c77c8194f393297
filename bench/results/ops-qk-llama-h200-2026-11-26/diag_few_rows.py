import sys, torch
sys.path.insert(0, ".")
from opsmith.ops import _norms, _launch
from torch.profiler import profile, ProfilerActivity
orig = _launch.norm_bwd_plan
props = _launch.device_props(0)
def kernels_us(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in ev) / n
for dt in (torch.bfloat16, torch.float32):
  for rows, cols in ((16, 8192), (64, 8192), (128, 8192), (64, 4096), (128, 4096), (64, 2048), (256, 2048), (128, 1024), (512, 1024), (256, 1024), (1024, 512), (64, 1024)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(rows, cols, device="cuda", dtype=dt)
    y, mean, rstd = _norms.layer_norm_fwd(x.detach(), [cols], w.detach(), w.detach(), 1e-5)
    _, rrstd = _norms.rms_norm_fwd(x.detach(), [cols], w.detach(), 1e-6)
    base = orig(rows, cols, x.element_size(), props)
    tpr, pb = base.block
    one_row = -(-rows // pb)
    out = []
    for label, grid in (("new", base.grid[0]), ("2rows", max(1, -(-rows // (2 * pb)))), ("4rows", max(1, -(-rows // (4 * pb))))):
        plan = _launch.Plan("persistent", (grid,), base.block, 0, 0)
        _launch.norm_bwd_plan = lambda *a, plan=plan: plan
        ln = kernels_us(lambda: _norms.layer_norm_bwd(g, x.detach(), [cols], mean, rstd, True, True, w.detach()))
        rm = kernels_us(lambda: _norms.rms_norm_bwd(g, x.detach(), [cols], rrstd, True, w.detach()))
        out.append(f"{label} g{grid}: ln {ln:6.2f} rms {rm:6.2f}")
    _launch.norm_bwd_plan = orig
    yl = torch.nn.functional.layer_norm(x, (cols,), w, w)
    ln_e = kernels_us(lambda: torch.autograd.grad(yl, (x, w), g, retain_graph=True))
    yr = torch.nn.functional.rms_norm(x, (cols,), w)
    rm_e = kernels_us(lambda: torch.autograd.grad(yr, (x, w), g, retain_graph=True))
    print(f"{str(dt)[6:]:9} {rows}x{cols} block {base.block}: " + " | ".join(out) + f" | eager ln {ln_e:6.2f} rms {rm_e:6.2f}", flush=True)
