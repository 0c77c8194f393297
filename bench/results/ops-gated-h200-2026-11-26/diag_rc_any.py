"""PROTOTYPE: the packed-chunk softmax forward (FULL rows) at 2 or 4 chunks and other blocks an SM, beside the plan and Liger."""
import os, sys, json, re
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import torch
import opsmith
from opsmith._torch._cuda_module import CudaModule
from opsmith._runtime import _driver
from opsmith.ops import _launch, _sources
from opsmith.ops import _functional as fn
from _kernel_timing import median_us
from liger_kernel.ops.softmax import _softmax_forward
arch = _driver.device_arch(0)
T = "__nv_bfloat16"
CFG = [(2, 512, 4), (2, 512, 3), (2, 256, 8), (2, 256, 6), (4, 256, 8), (4, 256, 6), (4, 128, 16), (4, 128, 12), (2, 128, 16)]
names = [f"rc_any<{T}, {c}, {t}, {b}>" for c, t, b in CFG]
b = opsmith.compile_cuda(open(".whlp/rc_any.cu").read(), name_expressions=names, include_paths=[str(_sources.KERNEL_DIR)],
                         arch=arch, std="c++17", options=["--ptxas-options=-v"])
print(re.findall(r"Compiling entry function '(\w+)'[^\n]*\n[^\n]*\n\D*(\d+) bytes stack frame, (\d+) bytes spill stores.*?Used (\d+) registers", b.log, re.S))
mod = CudaModule(b)
out = []
for rows, cols in ((8192, 8192), (32768, 8192), (16384, 4096), (4096, 4096), (2048, 2048), (65536, 1024)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 3
    ref = torch.softmax(x.double(), -1)
    res = {"plan": median_us(lambda: fn.softmax_cuda(x, -1), 30), "liger": median_us(lambda: _softmax_forward(x), 30)}
    for (c, t, bb), n in zip(CFG, names):
        if c * t * 8 != cols:
            continue
        k = mod.get_kernel(n); y = torch.empty_like(x)
        cfg = _launch.launch_config(_launch.Plan("wide", (rows,), (t, 1), 0, 0))
        k.launch(cfg, x, y, rows, cols)
        err = (y.double() - ref).abs().max().item()
        res[f"C{c} {t}x{bb}"] = median_us(lambda: k.launch(cfg, x, y, rows, cols), 30)
        assert err < 0.01, (n, err)
    gbs = {k: 2 * x.numel() * 2 / v / 1e3 for k, v in res.items()}
    print(rows, cols, " ".join(f"{k}={v:.0f}" for k, v in gbs.items()), flush=True)
    out.append({"shape": [rows, cols], "us": res})
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/rc-any.json", "w"), indent=1)
