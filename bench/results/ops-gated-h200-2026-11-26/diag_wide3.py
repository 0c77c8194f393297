"""PROTOTYPE: softmax_fwd_wide3 against softmax_fwd_wide at 512 threads a row, beside Liger (events, L2 flushed)."""
import os, sys, json
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import torch
from opsmith.ops import _launch, _sources
from _kernel_timing import median_us
from liger_kernel.ops.softmax import _softmax_forward
from opsmith.ops import _functional as fn
out = []
for dt, rows, cols in ((torch.bfloat16, 4096, 16384), (torch.bfloat16, 16384, 16384), (torch.bfloat16, 8192, 12288),
                       (torch.bfloat16, 4096, 9000), (torch.float16, 4096, 16384), (torch.float32, 4096, 8192),
                       (torch.float32, 8192, 6144), (torch.bfloat16, 1024, 16384), (torch.bfloat16, 2048, 16384)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3
    name = str(dt)[6:]
    k = {w: _sources.kernel("softmax.cu", f"softmax_fwd_{w}<{{T}}>", name, 0) for w in ("wide", "wide3")}
    cfg = _launch.launch_config(_launch.Plan("wide", (rows,), (512, 1), 0, 0))
    ys = {w: torch.empty_like(x) for w in k}
    for w in k:
        k[w].launch(cfg, x, ys[w], rows, cols)
    same = torch.equal(ys["wide"], ys["wide3"])
    ref = torch.softmax(x.double(), -1)
    err = {w: (ys[w].double() - ref).abs().max().item() for w in k}
    us = {w: median_us(lambda: k[w].launch(cfg, x, ys[w], rows, cols), 30) for w in k}
    us["ours (plan)"] = median_us(lambda: fn.softmax_cuda(x, -1), 30)
    us["liger"] = median_us(lambda: _softmax_forward(x), 30)
    gbs = {w: 2 * x.numel() * x.element_size() / v / 1e3 for w, v in us.items()}
    print(f"{name:9s} {rows}x{cols}: " + " ".join(f"{w} {v:5.0f}" for w, v in gbs.items())
          + f"  plan/wide {gbs['ours (plan)'] / gbs['wide']:.3f} plan/liger {gbs['ours (plan)'] / gbs['liger']:.3f} err {err}",
          flush=True)
    out.append({"dtype": name, "shape": [rows, cols], "us": us, "identical": same, "err": err})
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/wide3.json", "w"), indent=1)
