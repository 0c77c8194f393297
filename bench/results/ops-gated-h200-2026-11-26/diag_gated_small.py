"""PROTOTYPE: gated kernels at small shapes under other grids / R / min-blocks, beside Liger (events, L2 flushed)."""
import sys, json, os
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import torch
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _launch, _sources
from _kernel_timing import median_us
from liger_kernel.ops.swiglu import swiglu_forward, swiglu_backward
from liger_kernel.ops.geglu import geglu_forward, geglu_backward
arch, props = _driver.device_arch(0), _launch.device_props(0)
names = _sources.kernel_names("gated.cu", "bfloat16")
print(names)
mods = {}
def mod(R, fb, bb):
    k = (R, fb, bb)
    if k not in mods:
        mods[k] = CudaModule(_sources.KERNEL_DIR / "gated.cu", name_expressions=names, arch=arch,
                             defines={"OPSMITH_GATED_ROWS16": R, "OPSMITH_GATED_BLOCKS16": fb},
                             name=f"dg-{R}-{fb}-{bb}")
    return mods[k]
out = []
for rows, d in ((2048, 2048), (4096, 4096), (65536, 1024)):
    x = torch.randn(rows, 2 * d, dtype=torch.bfloat16, device="cuda")
    gate, up = x[:, :d], x[:, d:]
    a, b = gate.contiguous(), up.contiguous()
    g = torch.randn(rows, d, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(rows, d, dtype=torch.bfloat16, device="cuda"); dx = torch.empty_like(x)
    n = rows * d * 2
    units = d // 8; tx = min(256, 1 << (units - 1).bit_length()); ty = 256 // tx; gx = -(-units // tx)
    for op in ("silu", "gelu_tanh"):
        base = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}[op]
        fname, bname = f"{base}_fwd<__nv_bfloat16>", f"{base}_bwd<__nv_bfloat16>"
        shipped = _launch.gated_plan(rows, d, 2, props, op)
        wave = 528; gy = -(-rows // (ty * 2))
        gy = -(-wave // gx) if gx * gy <= 2 * wave else gy
        cfgs = {"shipped": ((1, 6, 6), shipped), "R2 b2 fold": ((2, 2, 2), _launch.Plan("gated", (gx, min(gy, 65535)), (tx, ty), 0, 0))}
        for cname, ((R, fb, bb), plan) in cfgs.items():
            m = mod(R, fb, bb); cfg = _launch.launch_config(plan)
            kf, kb = m.get_kernel(fname), m.get_kernel(bname)
            for dirn, fn, arrays in (("fwd", lambda: kf.launch(cfg, x.view(-1), x.view(-1)[d:], y, rows, d, 2 * d, 2 * d), 3),
                                     ("bwd", lambda: kb.launch(cfg, g, x.view(-1), x.view(-1)[d:], dx.view(-1), dx.view(-1)[d:], rows, d, 2 * d, 2 * d, 2 * d), 5)):
                us = median_us(fn, 30)
                out.append(dict(op=op, shape=[rows, d], cfg=cname, dir=dirn, us=us, grid=plan.grid))
                print(f"{op:10s} {rows}x{d} {dirn} {cname:14s} grid {plan.grid} {us:7.2f} us {arrays*n/us/1e3:6.0f} GB/s", flush=True)
        lf, lb = (swiglu_forward, swiglu_backward) if op == "silu" else (geglu_forward, geglu_backward)
        for dirn, fn, arrays in (("fwd", lambda: lf(a, b), 3), ("bwd", lambda: lb(a, b, g), 5)):
            us = median_us(fn, 30)
            out.append(dict(op=op, shape=[rows, d], cfg="liger", dir=dirn, us=us))
            print(f"{op:10s} {rows}x{d} {dirn} {'liger':14s} {'':16s} {us:7.2f} us {arrays*n/us/1e3:6.0f} GB/s", flush=True)
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/gated-small.json", "w"))
# the lean prototype (32-bit, one vector a thread) at the same grid as the shipped 16-bit plan
lm = CudaModule(".whlp/gated_lean.cu", name_expressions=["lean_silu_fwd<__nv_bfloat16>", "lean_silu_bwd<__nv_bfloat16>"],
                include_paths=[str(_sources.KERNEL_DIR)], arch=arch, name="lean")
lf, lb = lm.get_kernel("lean_silu_fwd<__nv_bfloat16>"), lm.get_kernel("lean_silu_bwd<__nv_bfloat16>")
for rows, d in ((2048, 2048), (4096, 4096)):
    x = torch.randn(rows, 2 * d, dtype=torch.bfloat16, device="cuda")
    a, b = x[:, :d].contiguous(), x[:, d:].contiguous()
    g = torch.randn(rows, d, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(rows, d, dtype=torch.bfloat16, device="cuda"); dx = torch.empty_like(x)
    n = rows * d * 2
    plan = _launch.gated_plan(rows, d, 2, props, "silu"); cfg = _launch.launch_config(plan)
    cols = d // 8
    for dirn, fn, arrays in (("fwd", lambda: lf.launch(cfg, x.view(-1), x.view(-1)[d:], y, rows, cols, 2 * d, 2 * d), 3),
                             ("bwd", lambda: lb.launch(cfg, g, x.view(-1), x.view(-1)[d:], dx.view(-1), dx.view(-1)[d:], rows, cols, 2 * d, 2 * d, 2 * d), 5)):
        us = median_us(fn, 30)
        print(f"silu lean  {rows}x{d} {dirn} grid {plan.grid} {us:7.2f} us {arrays*n/us/1e3:6.0f} GB/s", flush=True)
    for dirn, fn in (("fwd", lambda: swiglu_forward(a, b)), ("bwd", lambda: swiglu_backward(a, b, g))):
        print(f"silu liger {rows}x{d} {dirn} {median_us(fn, 30):7.2f} us", flush=True)
# Liger's SASS (triton cache) for a side-by-side read
import glob, subprocess
for c in glob.glob(os.path.expanduser("~/.triton/cache") + "/**/*swiglu*.cubin", recursive=True):
    subprocess.run(f"cuobjdump -sass {c} > {os.environ.get('OUT', '/tmp')}/liger_{os.path.basename(c)}.sass", shell=True)
