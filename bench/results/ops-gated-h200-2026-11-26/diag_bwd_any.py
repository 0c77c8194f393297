"""PROTOTYPE: softmax's backward row (FULL) at other blocks an SM, beside the plan and Liger (events, L2 flushed)."""
import os, sys, json, re
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import torch
import opsmith
from opsmith._torch._cuda_module import CudaModule
from opsmith._runtime import _driver
from opsmith.ops import _launch, _sources
from opsmith.ops import _functional as fn
from _kernel_timing import median_us
from liger_kernel.ops.softmax import _softmax_backward, _softmax_forward
arch = _driver.device_arch(0)
T = "__nv_bfloat16"
CFG = [(2, 256, 8), (2, 256, 6), (2, 256, 5), (2, 256, 4), (2, 512, 4), (2, 512, 3), (2, 512, 2), (2, 128, 16), (2, 128, 12), (2, 128, 8),
       (4, 256, 4), (4, 256, 6), (4, 512, 2), (4, 512, 3)]
names = [f"bwd_any<{T}, {c}, {t}, {b}>" for c, t, b in CFG]
b = opsmith.compile_cuda(open(".whlp/bwd_any.cu").read(), name_expressions=names, include_paths=[str(_sources.KERNEL_DIR)],
                         arch=arch, std="c++17", options=["--ptxas-options=-v"])
print(re.findall(r"Compiling entry function '(\w+)'[^\n]*\n[^\n]*\n\D*(\d+) bytes stack frame, (\d+) bytes spill stores.*?Used (\d+) registers", b.log, re.S))
mod = CudaModule(b)
props = _launch.device_props(0)
for rows, cols in ((4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192), (2048, 2048), (65536, 1024), (4096, 16384)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.softmax(x.float(), -1).to(torch.bfloat16)
    g = torch.randn_like(y)
    want = fn.softmax_backward_cuda(g, y, -1)
    lg = _softmax_forward(x)[1:]
    print(rows, cols, "plan", _launch.softmax_plan(rows, cols, 2, 2, props))
    res = {"plan": median_us(lambda: fn.softmax_backward_cuda(g, y, -1), 30),
           "liger": median_us(lambda: _softmax_backward(g, y, *lg), 30)}
    for (c, t, bb), n in zip(CFG, names):
        if c * t * 8 != cols:
            continue
        k = mod.get_kernel(n); dx = torch.empty_like(x)
        cfg = _launch.launch_config(_launch.Plan("wide", (rows,), (t, 1), 0, 0))
        k.launch(cfg, g, y, dx, rows, cols)
        assert torch.equal(dx, want), n
        res[f"C{c} {t}x{bb}"] = median_us(lambda: k.launch(cfg, g, y, dx, rows, cols), 30)
    gbs = {k: 3 * x.numel() * 2 / v / 1e3 for k, v in res.items()}
    print(rows, cols, " ".join(f"{k}={v:.0f}" for k, v in gbs.items()), flush=True)
