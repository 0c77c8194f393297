"""silu_and_mul and add_rms_norm on few rows: ours (the op, and its kernels called directly) against Liger-Kernel
(COMMAND.txt says what each line is). Run from the repository root, Liger on PYTHONPATH; needs a GPU."""
import sys, torch
sys.path.insert(0, "bench")
from diag_norm_split import per_kernel
from opsmith import ops
from opsmith.ops import _functional as fn, _fused
from liger_kernel.ops.swiglu import LigerSiLUMulFunction
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
for rows, d in ((512, 1024), (2048, 2048)):
    x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    a = x[:, :d].detach().contiguous().requires_grad_(); b = x[:, d:].detach().contiguous().requires_grad_()
    xd = x.detach()
    cases = {"ours": lambda: torch.autograd.grad(ops.silu_and_mul(x), x, g),
             "liger": lambda: torch.autograd.grad(LigerSiLUMulFunction.apply(a, b), (a, b), g),
             "raw": lambda: (fn.gated_bwd("silu", g, xd), fn.gated_fwd("silu", xd))[0],
             "raw_pair": lambda: fn.gated_bwd("silu", g, xd) if fn.gated_fwd("silu", xd) is not None else None}
    for name, f in cases.items():
        k = per_kernel(f)
        print(rows, d, name, {n: round(v, 2) for n, v in k.items()}, "sum", round(sum(k.values()), 2))
        print(rows, d, name, "GB/s", [round(ops.benchmark(f, bytes_moved=8 * g.nbytes, runs=300).gbps) for _ in range(3)])
rows, cols = 512, 1024
xs = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
cases = {"ours": lambda: ops.add_rms_norm(xs[0], xs[1], [cols], w, 1e-6),
         "raw": lambda: _fused.add_rms_norm_cuda(xs[0], xs[1], [cols], w, 1e-6),
         "liger": lambda: LigerFusedAddRMSNormFunction.apply(xs[0], xs[1], w, 1e-6)}
with torch.no_grad():
    for name, f in cases.items():
        k = per_kernel(f)
        print("add_rms", name, {n: round(v, 2) for n, v in k.items()})
        print("add_rms", name, "GB/s", [round(ops.benchmark(f, bytes_moved=4 * xs[0].nbytes, runs=300).gbps) for _ in range(3)])
