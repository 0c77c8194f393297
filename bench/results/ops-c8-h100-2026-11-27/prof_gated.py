import sys, torch
sys.path.insert(0, "bench")
from diag_norm_split import per_kernel
from opsmith import ops
from liger_kernel.ops.swiglu import LigerSiLUMulFunction
rows, d = 2048, 2048
x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
a = x[:, :d].detach().contiguous().requires_grad_(); b = x[:, d:].detach().contiguous().requires_grad_()
ours = lambda: torch.autograd.grad(ops.silu_and_mul(x), x, g)
lig = lambda: torch.autograd.grad(LigerSiLUMulFunction.apply(a, b), (a, b), g)
from opsmith.ops import _functional as fn
xd = x.detach()
raw = lambda: (fn.gated_fwd("silu", xd), fn.gated_bwd("silu", g, xd))
for name, f in (("ours", ours), ("liger", lig), ("raw", raw)):
    k = per_kernel(f)
    print(name, {n: round(v, 2) for n, v in k.items()}, "sum", round(sum(k.values()), 2))
    print(name, "benchmark GB/s", round(ops.benchmark(f, bytes_moved=8 * g.nbytes).gbps))
