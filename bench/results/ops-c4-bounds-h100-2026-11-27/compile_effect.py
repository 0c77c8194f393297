"""Does running torch.compile once change how fast Liger-Kernel's (Triton) rms_norm forward runs afterwards? Same
process, before and after; Triton knobs and env before/after."""
import os, sys, torch
import torch.nn.functional as F
sys.path.insert(0, "bench")
from opsmith import ops
from liger_kernel.ops.rms_norm import rms_norm_forward
import triton

def knobs():
    out = {}
    for sect in ("runtime", "compilation", "nvidia", "cache", "language"):
        o = getattr(triton.knobs, sect, None)
        if o is None:
            continue
        for k in dir(o):
            if k.startswith("_"):
                continue
            try:
                v = getattr(o, k)
            except Exception as e:
                v = f"<{type(e).__name__}>"
            if not callable(v) or v is None:
                out[f"{sect}.{k}"] = repr(v)[:120]
            else:
                out[f"{sect}.{k}"] = f"<callable {getattr(v, '__name__', type(v).__name__)}>"
    return out

def run(tag):
    for rows, cols in ((2048, 2048), (4096, 4096)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
        f = lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)
        g = lambda: ops.rms_norm(x, (cols,), w, 1e-6)
        src = torch.empty(x.nbytes, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
        c = lambda: dst.copy_(src)
        f(); g()
        print(tag, rows, cols, " ".join(f"{n} {round(ops.benchmark(h, bytes_moved=2 * x.nbytes, runs=300).gbps)}"
                                         for n, h in (("liger", f), ("ours", g), ("copy", c))), flush=True)

env0, k0 = dict(os.environ), knobs()
run("before")
comp = torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), dynamic=False)
xx = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16); comp(xx, torch.ones(256, device="cuda", dtype=torch.bfloat16))
run("after-compile")
env1, k1 = dict(os.environ), knobs()
print("env changed:", {k: env1.get(k) for k in set(env0) ^ set(env1) | {k for k in env0 if env0[k] != env1.get(k)}})
print("knobs changed:", {k: (k0.get(k), k1.get(k)) for k in set(k0) | set(k1) if k0.get(k) != k1.get(k)})
print("cuda alloc conf", torch.cuda.memory.get_allocator_backend() if hasattr(torch.cuda.memory, "get_allocator_backend") else "")
