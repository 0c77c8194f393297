import sys, torch, functools
sys.path.insert(0, ".")
from opsmith.ops import _norms, _launch
from torch.profiler import profile, ProfilerActivity
dt = torch.bfloat16
orig = _launch.norm_bwd_plan
props = _launch.device_props(0)
def kernels_us(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in ev) / n, {e.name.split("<")[0][5:30] for e in ev}
for rows, cols in ((512, 1024), (2048, 2048), (4096, 1024), (1024, 4096), (8192, 2048)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    w = torch.randn(cols, device="cuda", dtype=dt)
    g = torch.randn(rows, cols, device="cuda", dtype=dt)
    y, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, w, 1e-5)
    _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
    base = orig(rows, cols, 2, props)
    tpr, pb = base.block
    one_row = -(-rows // pb)
    for label, grid in (("default", base.grid[0]), ("1row/lane", min(one_row, 8 * props.sm_count)),
                        ("2x", 2 * base.grid[0]), ("half", max(1, base.grid[0] // 2))):
        plan = _launch.Plan("persistent", (grid,), base.block, 0, 0)
        _launch.norm_bwd_plan = lambda *a, plan=plan: plan
        ln, _ = kernels_us(lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w))
        rm, _ = kernels_us(lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w))
        print(f"{rows}x{cols} {label:<10} grid {grid:5d} block {base.block}: ln bwd {ln:6.2f} us  rms bwd {rm:6.2f} us", flush=True)
    _launch.norm_bwd_plan = orig
