import sys, functools, torch
sys.path.insert(0, ".")
from opsmith.ops import _norms, _launch
from torch.profiler import profile, ProfilerActivity
def per_kernel(fn, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    d = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = e.name.split("<")[0].split("(")[0].replace("void ", "")[-24:]
            d[k] = d.get(k, 0) + e.device_time / n
    return d
def fmt(d): return " + ".join(f"{k} {v:.1f}" for k, v in d.items()) + f" = {sum(d.values()):.1f}"
orig_cl, orig_w = _launch.norm_cluster_plan, _launch.weight_grad_plan
for dt, rows, cols in [(torch.bfloat16, 2048, 32768), (torch.bfloat16, 4096, 16384), (torch.bfloat16, 1024, 32768), (torch.bfloat16, 4096, 32768), (torch.float32, 2048, 16384), (torch.float32, 2048, 32768)]:
    x = torch.randn(rows, cols, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(cols, device="cuda", dtype=dt, requires_grad=True)
    g = torch.randn(rows, cols, device="cuda", dtype=dt)
    xd, wd = x.detach(), w.detach()
    _, mean, rstd = _norms.layer_norm_fwd(xd, [cols], wd, wd, 1e-5)
    _, rrstd = _norms.rms_norm_fwd(xd, [cols], wd, 1e-6)
    mb = 3 * rows * cols * x.element_size() / 1e6
    print(f"== {str(dt)[6:]} {rows}x{cols}  (bwd floor {mb:.0f} MB)", flush=True)
    for label in ("cluster", "long", "long+wcl"):
        if label.startswith("long"):
            _launch.norm_cluster_plan = lambda r, c, i, p, b: None if b else orig_cl(r, c, i, p, b)
        if label == "long+wcl":
            _launch.weight_grad_plan = lambda r, c, i, p: (_launch.Plan("cluster", (8, -(-c // (32 * (16 // i)))), (32, 8), 0, 0, 8), -(-r // 8))
        ln = per_kernel(functools.partial(_norms.layer_norm_bwd, g, xd, [cols], mean, rstd, True, True, wd))
        rm = per_kernel(functools.partial(_norms.rms_norm_bwd, g, xd, [cols], rrstd, True, wd))
        _launch.norm_cluster_plan, _launch.weight_grad_plan = orig_cl, orig_w
        print(f"  {label:8} LN {fmt(ln)} ({mb * 1e3 / sum(ln.values()):.0f} GB/s) | RMS {fmt(rm)} ({mb * 1e3 / sum(rm.values()):.0f} GB/s)", flush=True)
    yl = torch.nn.functional.layer_norm(x, (cols,), w, w)
    yr = torch.nn.functional.rms_norm(x, (cols,), w)
    el = per_kernel(functools.partial(torch.autograd.grad, yl, (x, w), g, retain_graph=True))
    er = per_kernel(functools.partial(torch.autograd.grad, yr, (x, w), g, retain_graph=True))
    print(f"  eager    LN {fmt(el)} | RMS {fmt(er)}", flush=True)
