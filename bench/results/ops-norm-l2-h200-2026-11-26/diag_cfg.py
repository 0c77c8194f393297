"""Kernel configs (grid, block, registers, smem, us) of ours vs compile / Liger, bf16, via profiler trace."""
import json, os, sys, tempfile, functools
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, ".")
import opsmith.ops as ops
try:
    from liger_kernel.transformers import functional as lf
except Exception as e:
    print("no liger", e); lf = None
OUT = os.environ.get("OUT", "/tmp")

def trace(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    f = tempfile.mktemp(suffix=".json"); p.export_chrome_trace(f)
    ev = json.load(open(f))["traceEvents"]; os.unlink(f)
    agg = {}
    for e in ev:
        if e.get("cat") != "kernel": continue
        a = e.get("args", {})
        k = e["name"].split("(")[0].replace("void ", "")[:60]
        r = agg.setdefault(k, {"us": 0.0, "grid": a.get("grid"), "block": a.get("block"),
             "regs": a.get("registers per thread"), "smem": a.get("shared memory"), "occ": a.get("est. achieved occupancy %")})
        r["us"] += e["dur"] / n
    return agg

res = {}
def show(label, fn, gb):
    try:
        agg = trace(fn)
    except Exception as e:
        print(label, "FAILED", repr(e)[:200]); return
    tot = sum(v["us"] for v in agg.values())
    print(f"{label:<40} {tot:8.2f} us {gb*1e3/tot:6.0f} GB/s", flush=True)
    for k, v in agg.items():
        print(f"    {k:<60} {v['us']:8.2f} grid={v['grid']} block={v['block']} regs={v['regs']} smem={v['smem']} occ={v['occ']}")
    res[label] = agg

dt = torch.bfloat16
for rows, cols in ((4096, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (65536, 1024)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    w = torch.randn(cols, device="cuda", dtype=dt); b = torch.randn(cols, device="cuda", dtype=dt)
    gb = 2 * rows * cols * 2 / 1e9
    torch._dynamo.reset()
    ln_c = torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False)
    sm_c = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
    rms_c = torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)
    with torch.no_grad():
        show(f"ln fwd ours {rows}x{cols}", lambda: ops.layer_norm(x, (cols,), w, b), gb)
        show(f"ln fwd compile {rows}x{cols}", lambda: ln_c(x, w, b), gb)
        if lf: show(f"ln fwd liger {rows}x{cols}", lambda: lf.liger_layer_norm(x, w, b, 1e-5), gb)
        show(f"rms fwd ours {rows}x{cols}", lambda: ops.rms_norm(x, (cols,), w), gb)
        show(f"rms fwd compile {rows}x{cols}", lambda: rms_c(x, w), gb)
        show(f"sm fwd ours {rows}x{cols}", lambda: ops.softmax(x, -1), gb)
        show(f"sm fwd compile {rows}x{cols}", lambda: sm_c(x), gb)
        if lf: show(f"sm fwd liger {rows}x{cols}", lambda: lf.liger_softmax(x), gb)
    # softmax backward alone
    xg = x.clone().requires_grad_(True); g = torch.randn_like(x)
    y = ops.softmax(xg, -1)
    show(f"sm bwd ours {rows}x{cols}", lambda: torch.autograd.grad(y, xg, g, retain_graph=True), gb * 1.5)
    if lf:
        yl = lf.liger_softmax(xg)
        show(f"sm bwd liger {rows}x{cols}", lambda: torch.autograd.grad(yl, xg, g, retain_graph=True), gb * 1.5)
    if (rows, cols) == (4096, 16384):
        from torch._inductor.utils import run_and_get_code
        torch._dynamo.reset()
        with torch.no_grad():
            _, code = run_and_get_code(torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False), x, w, b)
        open(os.path.join(OUT, "inductor_ln_4096x16384.py"), "w").write("\n\n".join(code))
json.dump(res, open(os.path.join(OUT, "cfg.json"), "w"), indent=1)
