"""PROTOTYPE diag: row forwards streamed through shared memory by bulk async copies (stream_proto.cu) against
the plan now, Liger, torch.compile(dynamic=False) and a copy of the same bytes; kernels alone (torch.profiler)."""
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "bench"); sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops._sources import KERNEL_DIR  # noqa: E402
from opsmith.ops import _launch, _norms  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith._runtime._launch_config import LaunchConfig  # noqa: E402

try:
    from liger_kernel.ops.softmax import _softmax_forward
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
    LIGER = True
except Exception as e:  # noqa: BLE001
    LIGER = False
    print("no liger", e)

QUICK = "--quick" in sys.argv
shutil.copy(".whlp/stream_proto.cu", KERNEL_DIR / "stream_proto.cu")
arch = _driver.device_arch(0)
props = _launch.device_props(0)
TN = {torch.bfloat16: "__nv_bfloat16", torch.float32: "float"}
names = [f"row_stream<{op}, {t}>" for op in (0, 1, 2) for t in TN.values()]
mods = {u: CudaModule(KERNEL_DIR / "stream_proto.cu", name_expressions=names, arch=arch, defines={"PROTO_U": u},
                      name=f"stream{u}") for u in (1, 2, 4)}
os.remove(KERNEL_DIR / "stream_proto.cu")
print("props", props, flush=True)

# (threads, blocks an SM, U, hint, cs, chunks a thread target)
VARIANTS = [(512, 1, 2, 1, 0, 2), (512, 2, 2, 1, 0, 2), (1024, 1, 2, 1, 0, 2), (256, 2, 2, 1, 0, 2),
            (256, 4, 2, 1, 0, 2), (512, 2, 2, 0, 0, 2), (512, 2, 2, 1, 1, 2), (512, 2, 4, 1, 0, 4),
            (512, 2, 1, 1, 0, 1), (256, 4, 1, 1, 0, 2)]
if QUICK:
    VARIANTS = VARIANTS[:3]


def pow2(n):
    p = 1
    while p < n:
        p *= 2
    return p


def config(rows, cols, item, v):
    threads, bps, u, hint, cs, cpt = v
    nv = cols * item // 16
    tpr = min(threads, pow2(-(-nv // cpt)))
    ry = threads // tpr
    tile = ry * cols * item
    budget = min((props.smem_per_sm - bps * 1024) // bps, props.smem_per_block_optin) - 1024
    stages = min(16, budget // tile)
    if stages < 2:
        return None
    tiles = -(-rows // ry)
    grid = min(tiles, props.sm_count * bps)
    return LaunchConfig((grid,), (tpr, ry), stages * tile), stages


SHAPES = [(torch.bfloat16, r, c) for r, c in ((4096, 4096), (16384, 4096), (65536, 1024), (8192, 8192),
                                               (4096, 16384), (2048, 32768), (32768, 8192), (2048, 2048),
                                               (2048, 8192))]
SHAPES += [(torch.float32, 8192, 8192), (torch.float32, 16384, 4096)]
if QUICK:
    SHAPES = SHAPES[:4]
records = []
for dt, rows, cols in SHAPES:
    x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
    w = torch.randn(cols, device="cuda", dtype=dt)
    b = torch.randn(cols, device="cuda", dtype=dt)
    y = torch.empty_like(x)
    s1 = torch.empty(rows, device="cuda")
    s2 = torch.empty(rows, device="cuda")
    gb = 2 * x.numel() * x.element_size() / 1e3
    item = x.element_size()
    copy_us = sum(per_kernel(lambda: y.copy_(x)).values())
    torch._dynamo.reset()
    comp = {"layer_norm": torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False),
            "rms_norm": torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)}
    for op_i, op in enumerate(("softmax", "rms_norm", "layer_norm")):
        if op == "softmax":
            ours = lambda: fn.softmax_cuda(x, -1)
            ref = torch.softmax(x.double(), -1)
            lig = (lambda: _softmax_forward(x)) if LIGER else None
            cmp_ = None
        elif op == "rms_norm":
            ours = lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0]
            ref = F.rms_norm(x.double(), (cols,), w.double(), 1e-6)
            lig = (lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)) if LIGER else None
            cmp_ = lambda: comp["rms_norm"](x, w)
        else:
            ours = lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0]
            ref = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
            lig = (lambda: layer_norm_forward(x, w, b, 1e-5)) if LIGER else None
            cmp_ = lambda: comp["layer_norm"](x, w, b)
        rec = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols, "copy": gb / copy_us}
        rec["ours"] = gb / sum(per_kernel(ours).values())
        rec["ours_err"] = (ours().double() - ref).abs().max().item()
        if lig is not None:
            try:
                rec["liger"] = gb / sum(per_kernel(lig).values())
            except Exception as e:  # noqa: BLE001
                rec["liger_error"] = str(e)[:200]
        if cmp_ is not None:
            rec["compile"] = gb / sum(per_kernel(cmp_).values())
        eps = 1e-6 if op == "rms_norm" else 1e-5
        for v in VARIANTS:
            c = config(rows, cols, item, v)
            if c is None:
                continue
            cfg, stages = c
            k = mods[v[2]].get_kernel(f"row_stream<{op_i}, {TN[dt]}>")
            run = lambda: k.launch(cfg, x, y, w, b, s1, s2, rows, cols, stages, eps, v[3], v[4])
            y.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            err = (y.double() - ref).abs().max().item()
            key = "v" + "-".join(map(str, v))
            rec[key] = gb / sum(per_kernel(run).values())
            rec[key + "_err"] = err
            rec[key + "_cfg"] = [cfg.grid[0], cfg.block[0], cfg.block[1], stages]
        del ref
        best = max((kk for kk in rec if kk.startswith("v") and not kk.endswith(("_err", "_cfg"))),
                   key=lambda kk: rec[kk], default=None)
        peers = {kk: rec[kk] for kk in ("liger", "compile") if kk in rec}
        print(f"{op:<10} {rec['dtype']:<8} {rows:>6}x{cols:<6} copy {rec['copy']:5.0f} ours {rec['ours']:5.0f} "
              + " ".join(f"{kk} {vv:5.0f}" for kk, vv in peers.items())
              + (f" | best {best} {rec[best]:5.0f} ({rec[best] / rec['copy'] * 100:3.0f}% copy) err {rec[best + '_err']:.1e} "
                 f"(ours {rec['ours_err']:.1e})" if best else "")
              + " | " + " ".join(f"{kk[1:]}:{rec[kk]:.0f}" for kk in rec if kk.startswith("v")
                                 and not kk.endswith(("_err", "_cfg"))), flush=True)
        records.append(rec)
out = os.environ.get("OUT", "/tmp")
json.dump({"device": torch.cuda.get_device_name(), "records": records}, open(os.path.join(out, "stream.json"), "w"),
          indent=1)
