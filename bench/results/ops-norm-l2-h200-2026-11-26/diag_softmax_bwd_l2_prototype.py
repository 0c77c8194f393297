"""softmax backward: l2 prototype variants vs plan vs Liger, kernels alone; also rerun of ours fwd."""
import sys, json, os
import torch
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
from diag_norm_split import per_kernel
from opsmith._runtime._launch_config import LaunchConfig
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops._sources import DTYPES, KERNEL_DIR
from opsmith.ops import _functional as fn
try:
    from liger_kernel.ops.softmax import _softmax_backward, _softmax_forward
except Exception as e:
    print("no liger", e); _softmax_backward = None
V = [(512, 1, 2), (512, 2, 2), (256, 2, 2), (1024, 1, 2), (1024, 2, 2), (512, 2, 1), (256, 1, 2)]
arch = _driver.device_arch(0)
mods = {}
for dt in (torch.bfloat16, torch.float32):
    t = DTYPES[str(dt)[6:]][0]
    mods[dt] = CudaModule(KERNEL_DIR / "softmax_l2.cu", name_expressions=sorted({f"softmax_bwd_l2<{u}, {r}, {t}>" for _, u, r in V}), arch=arch, name="sml2")
res = []
for dt, rows, cols in [(torch.bfloat16, 4096, 4096), (torch.bfloat16, 8192, 8192), (torch.bfloat16, 4096, 16384), (torch.bfloat16, 2048, 32768), (torch.bfloat16, 16384, 4096), (torch.bfloat16, 65536, 1024), (torch.float32, 4096, 8192), (torch.float32, 2048, 16384)]:
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    y = torch.softmax(x.float(), -1).to(dt); g = torch.randn_like(y)
    gb = 3 * rows * cols * y.element_size() / 1e3
    ref = (y.double() * (g.double() - (g.double() * y.double()).sum(-1, keepdim=True)))
    r = {"shape": f"{str(dt)[6:]} {rows}x{cols}"}
    r["plan"] = sum(per_kernel(lambda: fn.softmax_backward_cuda(g, y, -1)).values())
    if _softmax_backward:
        bs, nw = __import__("liger_kernel.ops.utils", fromlist=["x"]).calculate_settings(cols)
        r["liger"] = sum(per_kernel(lambda: _softmax_backward(g, y, bs, nw, False)).values())
    nv = cols // (16 // y.element_size())
    t = DTYPES[str(dt)[6:]][0]
    for th, u, rr in V:
        tpb = max(32, min(th, 1 << (max(1, -(-nv // u)) - 1).bit_length()))
        k = mods[dt].get_kernel(f"softmax_bwd_l2<{u}, {rr}, {t}>")
        dx = torch.empty_like(y); cfg = LaunchConfig((rows,), (tpb,), 0)
        f = lambda: k.launch(cfg, g, y, dx, rows, cols)
        r[f"{th}/{u}/{rr}"] = sum(per_kernel(f).values())
        f(); torch.cuda.synchronize()
        r[f"err {th}/{u}/{rr}"] = (dx.double() - ref).abs().max().item()
    res.append(r)
    print(r["shape"], " ".join(f"{k}:{gb / v:.0f}" for k, v in r.items() if k not in ("shape",) and not k.startswith("err")),
          "| err", max(v for k, v in r.items() if k.startswith("err")), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "diag-sm-l2.json"), "w"), indent=1)
