"""PROTOTYPE: softmax_fwd_wide at other launch bounds / a recomputing row, beside Liger (events, L2 flushed)."""
import os, re, sys, json
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import torch
import opsmith
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _launch, _sources
from opsmith.ops import _functional as fn
from _kernel_timing import median_us
from liger_kernel.ops.softmax import _softmax_forward
arch = _driver.device_arch(0)
T = "__nv_bfloat16"
VARS = {"lb": [(512, 1), (512, 2), (512, 3), (512, 4), (256, 4), (256, 5), (256, 6), (256, 8), (1024, 1)],
        "rc": [(512, 2), (512, 3), (512, 4), (256, 4), (256, 6), (256, 8), (1024, 1), (1024, 2)]}
names = [f"sm_wide_{k}<{T}, {a}, {b}>" for k, v in VARS.items() for a, b in v]
src = open(".whlp/softmax_wide_var.cu").read()
b = opsmith.compile_cuda(src, name_expressions=names, include_paths=[str(_sources.KERNEL_DIR)], arch=arch, std="c++17",
                         options=["--ptxas-options=-v"])
print(re.findall(r"Compiling entry function '(\w+)'[^\n]*\n[^\n]*\n\D*(\d+) bytes stack frame, (\d+) bytes spill stores.*?Used (\d+) registers", b.log, re.S))
mod = CudaModule(b)
out = []
for rows, cols in ((4096, 16384), (8192, 8192), (2048, 32768), (16384, 4096), (4096, 4096)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.empty_like(x)
    ref = torch.softmax(x.float(), -1)
    tpr = _launch.softmax_plan(rows, cols, 2, 1, _launch.device_props(0)).block[0]
    res = {"ours": median_us(lambda: fn.softmax_cuda(x, -1), 30), "liger": median_us(lambda: _softmax_forward(x), 30)}
    for k, v in VARS.items():
        for a, bb in v:
            if a != tpr:
                continue
            kern = mod.get_kernel(f"sm_wide_{k}<{T}, {a}, {bb}>")
            cfg = _launch.launch_config(_launch.Plan("wide", (rows,), (tpr, 1), 0, 0))
            kern.launch(cfg, x, y, rows, cols)
            torch.cuda.synchronize()
            err = (y.float() - ref).abs().max().item()
            res[f"{k} {a},{bb}"] = median_us(lambda: kern.launch(cfg, x, y, rows, cols), 30)
            res[f"{k} {a},{bb} err"] = err
    gbs = {k: 2 * x.numel() * 2 / v / 1e3 for k, v in res.items() if not k.endswith("err")}
    print(rows, cols, "tpr", tpr, " ".join(f"{k}={v:.0f}" for k, v in gbs.items()), flush=True)
    out.append({"shape": [rows, cols], "us": res})
# Liger's registers
from liger_kernel.ops import softmax as ls
for name in dir(ls):
    obj = getattr(ls, name)
    cache = getattr(obj, "device_caches", None) or getattr(obj, "cache", None)
    if cache:
        try:
            for dev, c in (cache.items() if isinstance(cache, dict) else []):
                kc = c[0] if isinstance(c, tuple) else c
                for key, k in kc.items():
                    print(name, "n_regs", getattr(k, "n_regs", None), "n_spills", getattr(k, "n_spills", None), str(key)[:120])
        except Exception as e:
            print(name, "cache read failed", e)
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/softmax-occ.json", "w"), indent=1)
