"""PROTOTYPE: FULL 16-bit rows (16,384) of softmax: wide, wide3 and variants of wide3's row (events, L2 flushed)."""
import os, sys, json
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import torch
import opsmith
from opsmith._torch._cuda_module import CudaModule
from opsmith._runtime import _driver
from opsmith.ops import _launch, _sources
from _kernel_timing import median_us
from liger_kernel.ops.softmax import _softmax_forward
arch = _driver.device_arch(0)
out = []
for dt, rows, cols in ((torch.bfloat16, 4096, 16384), (torch.bfloat16, 16384, 16384), (torch.float16, 4096, 16384),
                       (torch.bfloat16, 2048, 16384)):
    T = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}[dt]
    name = str(dt)[6:]
    vnames = {f"v R{int(r == 'true')} B{int(b == 'true')} A{int(a == 'true')}": f"w3v<{T}, {r}, {b}, {a}>"
              for r in ("true", "false") for b in ("true", "false") for a in ("true", "false")}
    mod = CudaModule(open(".whlp/wide3_full.cu").read(), name_expressions=list(vnames.values()),
                     include_paths=[str(_sources.KERNEL_DIR)], arch=arch, name="w3full")
    proto = CudaModule(open(".whlp/softmax_wide_var.cu").read(), name_expressions=[f"sm_wide_rc<{T}, 512, 3>"],
                       include_paths=[str(_sources.KERNEL_DIR)], arch=arch, name="rcproto")
    k = {w: _sources.kernel("softmax.cu", f"softmax_fwd_{w}<{{T}}>", name, 0) for w in ("wide", "wide3")}
    k.update({v: mod.get_kernel(n) for v, n in vnames.items()})
    k["proto rc"] = proto.get_kernel(f"sm_wide_rc<{T}, 512, 3>")
    x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3
    cfg = _launch.launch_config(_launch.Plan("wide", (rows,), (512, 1), 0, 0))
    ref = torch.softmax(x.double(), -1)
    res = {}
    for w, kern in k.items():
        y = torch.empty_like(x)
        kern.launch(cfg, x, y, rows, cols)
        err = (y.double() - ref).abs().max().item()
        res[w] = (median_us(lambda: kern.launch(cfg, x, y, rows, cols), 30), err)
    res["liger"] = (median_us(lambda: _softmax_forward(x), 30), 0.0)
    gbs = {w: 2 * x.numel() * 2 / us / 1e3 for w, (us, _) in res.items()}
    print(f"{name} {rows}x{cols}: " + ", ".join(f"{w} {g:.0f}" + (f" (err {res[w][1]:.1e})" if res[w][1] > 0.01 else "")
                                              for w, g in gbs.items()), flush=True)
    out.append({"dtype": name, "shape": [rows, cols], "res": res})
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/w3full.json", "w"), indent=1)
