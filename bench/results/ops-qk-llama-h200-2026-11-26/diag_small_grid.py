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
  for rows, cols in ((256, 1024), (512, 1024), (1024, 1024), (512, 2048), (2048, 1024), (256, 4096), (1024, 2048), (2048, 2048), (4096, 1024)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    w = torch.randn(cols, device="cuda", dtype=dt)
    g = torch.randn(rows, cols, device="cuda", dtype=dt)
    y, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, w, 1e-5)
    _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
    base = orig(rows, cols, x.element_size(), props)
    tpr, pb = base.block
    one_row = -(-rows // pb)
    out = []
    for label, grid in (("default", base.grid[0]), ("1row", min(one_row, 8 * props.sm_count)),
                        ("fill", max(base.grid[0], min(one_row, props.sm_count)))):
        plan = _launch.Plan("persistent", (grid,), base.block, 0, 0)
        _launch.norm_bwd_plan = lambda *a, plan=plan: plan
        ln = kernels_us(lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w))
        rm = kernels_us(lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w))
        out.append(f"{label} g{grid}: ln {ln:6.2f} rms {rm:6.2f}")
    _launch.norm_bwd_plan = orig
    print(f"{str(dt)[6:]:9} {rows}x{cols} block {base.block}: " + " | ".join(out), flush=True)
