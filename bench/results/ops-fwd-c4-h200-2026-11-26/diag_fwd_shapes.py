"""PROTOTYPE diag: the register-row forwards (norm.cu, softmax.cu) at other launch shapes: chunks a thread
(2, or 4 with the kernels recompiled for it), threads a row and rows a block; kernels alone (torch.profiler),
GB/s of the bytes-moved floor, beside the plan now, Liger and a copy of the same bytes."""
import json
import os
import sys

import torch

sys.path.insert(0, "bench"); sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._runtime._launch_config import LaunchConfig  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _norms  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops._sources import KERNEL_DIR  # noqa: E402

try:
    from liger_kernel.ops.softmax import _softmax_forward
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
    LIGER = True
except Exception as e:  # noqa: BLE001
    LIGER = False
    print("no liger", e)

arch = _driver.device_arch(0)
TN = {torch.bfloat16: "__nv_bfloat16", torch.float32: "float"}


def mod(file, names, defines, tag):
    exprs = [n.format(T=t) for n in names for t in TN.values()]
    return CudaModule(KERNEL_DIR / file, name_expressions=exprs, arch=arch, defines=defines, name=f"fs_{tag}")


NORM = ["layer_norm_fwd<{T}, float>", "layer_norm_fwd_wide<{T}, float>", "rms_norm_fwd<{T}, float>"]
SM = ["softmax_fwd<{T}>", "softmax_fwd_wide<{T}>"]
mods = {"n2": mod("norm.cu", NORM, {}, "n2"), "n4": mod("norm.cu", NORM, {"OPSMITH_ROW_CHUNKS": 4, "OPSMITH_ROW_THREADS": 256}, "n4"),
        "s2": mod("softmax.cu", SM, {}, "s2"), "s4": mod("softmax.cu", SM, {"OPSMITH_ROW_CHUNKS": 4, "OPSMITH_ROW_THREADS": 256}, "s4")}
# (op, module, kernel, chunks, most threads a block)
KERNELS = [("layer_norm", "n2", "layer_norm_fwd", 2, 512), ("layer_norm", "n2", "layer_norm_fwd_wide", 2, 512),
           ("layer_norm", "n4", "layer_norm_fwd", 4, 256), ("layer_norm", "n4", "layer_norm_fwd_wide", 4, 256),
           ("rms_norm", "n2", "rms_norm_fwd", 2, 512), ("rms_norm", "n4", "rms_norm_fwd", 4, 256),
           ("softmax", "s2", "softmax_fwd", 2, 512), ("softmax", "s4", "softmax_fwd", 4, 256),
           ("softmax", "s2", "softmax_fwd_wide", 4, 1024)]
SHAPES = [(torch.bfloat16, r, c) for r, c in ((65536, 1024), (16384, 2048), (2048, 2048), (4096, 4096), (16384, 4096),
                                               (2048, 8192), (8192, 8192), (32768, 8192))]
SHAPES += [(torch.float32, r, c) for r, c in ((65536, 1024), (16384, 2048), (16384, 4096))]
records = []
for dt, rows, cols in SHAPES:
    x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
    w = torch.randn(cols, device="cuda", dtype=dt)
    b = torch.randn(cols, device="cuda", dtype=dt)
    y = torch.empty_like(x)
    mean = torch.empty(rows, device="cuda")
    rstd = torch.empty(rows, device="cuda")
    gb = 2 * x.numel() * x.element_size() / 1e3
    vec = 16 // x.element_size()
    copy = gb / sum(per_kernel(lambda: y.copy_(x)).values())
    for op in ("layer_norm", "rms_norm", "softmax"):
        if op == "softmax":
            now, lig = (lambda: fn.softmax_cuda(x, -1)), (lambda: _softmax_forward(x))
            ref = fn.softmax_cuda(x, -1).float()
        elif op == "rms_norm":
            now, lig = (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0]), (lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None))
            ref = now().float()
        else:
            now, lig = (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0]), (lambda: layer_norm_forward(x, w, b, 1e-5))
            ref = now().float()
        rec = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols, "copy": copy,
               "now": gb / sum(per_kernel(now).values())}
        if LIGER:
            rec["liger"] = gb / sum(per_kernel(lig).values())
        var = {}
        for kop, m, kname, chunks, most in KERNELS:
            if kop != op or (cols // vec) % chunks:
                continue
            tpr = cols // vec // chunks
            if tpr & (tpr - 1) or tpr > most:
                continue
            k = mods[m].get_kernel(f"{kname}<{TN[dt]}" + (">" if op == "softmax" else ", float>"))
            for threads in (32, 64, 128, 256, 512, 1024):
                if threads < tpr or threads > most or rows % (threads // tpr):
                    continue
                ry = threads // tpr
                cfg = LaunchConfig((rows // ry,), (tpr, ry), 0)
                if op == "softmax":
                    args = (x, y, rows, cols)
                elif op == "rms_norm":
                    args = (x, w, y, rstd, rows, cols, 1e-6, 1)
                else:
                    args = (x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1)
                y.fill_(float("nan"))
                k.launch(cfg, *args)
                err = (y.float() - ref).abs().max().item()
                key = f"{m}:{kname}:{tpr}x{ry}"
                var[key] = gb / sum(per_kernel(lambda: k.launch(cfg, *args)).values())
                if not err <= 0.07:
                    var[key + "_bad"] = err
        rec["variants"] = var
        top = sorted(((v, kk) for kk, v in var.items() if not kk.endswith("_bad")), reverse=True)[:3]
        print(f"{op:<10} {rec['dtype']:<8} {rows:>6}x{cols:<5} copy {copy:5.0f} now {rec['now']:5.0f} liger "
              f"{rec.get('liger', 0):5.0f} | " + "  ".join(f"{kk} {v:5.0f}" for v, kk in top)
              + ("  BAD " + str([kk for kk in var if kk.endswith('_bad')]) if any(kk.endswith('_bad') for kk in var) else ""),
              flush=True)
        records.append(rec)
json.dump({"device": torch.cuda.get_device_name(), "records": records},
          open(os.path.join(os.environ.get("OUT", "/tmp"), "fwd-shapes.json"), "w"), indent=1)
