import sys, json, os, shutil
import torch
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
from diag_norm_split import per_kernel
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops._sources import KERNEL_DIR
from opsmith.ops import _launch
from opsmith.ops import _functional as fn
try:
    from liger_kernel.ops.softmax import _softmax_forward
except Exception as e:
    _softmax_forward = None; print("no liger", e)
shutil.copy(".whlp/softmax_var.cu", KERNEL_DIR / "softmax_var.cu")
arch = _driver.device_arch(0)
mods = {}
for cs in (0, 1):
    for ld in (0, 1):
        mods[(cs, ld)] = CudaModule(KERNEL_DIR / "softmax_var.cu", name_expressions=["softmax_fwd<__nv_bfloat16>", "softmax_fwd_wide<__nv_bfloat16>"], arch=arch, defines={"VAR_CS": cs, "VAR_LD": ld}, name=f"smvar{cs}{ld}")
out = []
for rows, cols in ((4096, 4096), (8192, 8192), (16384, 4096), (32768, 8192), (4096, 16384), (2048, 8192)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    gb = 2 * rows * cols * 2 / 1e3
    plan = _launch.softmax_plan(rows, cols, 2, 1, _launch.device_props(0))
    cfg = _launch.launch_config(plan)
    name = "softmax_fwd_wide<__nv_bfloat16>" if plan.strategy == "wide" else "softmax_fwd<__nv_bfloat16>"
    r = {"shape": f"{rows}x{cols}", "plan": plan.strategy, "ours": gb / sum(per_kernel(lambda: fn.softmax_cuda(x, -1)).values())}
    ref = fn.softmax_cuda(x, -1)
    for key, m in mods.items():
        k = m.get_kernel(name); y = torch.empty_like(x)
        r[f"cs{key[0]}ld{key[1]}"] = gb / sum(per_kernel(lambda: k.launch(cfg, x, y, rows, cols)).values())
        assert torch.equal(y, ref), key
    if _softmax_forward:
        r["liger"] = gb / sum(per_kernel(lambda: _softmax_forward(x)).values())
    out.append(r); print(r, flush=True)
os.remove(KERNEL_DIR / "softmax_var.cu")
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "sm-var.json"), "w"), indent=1)
