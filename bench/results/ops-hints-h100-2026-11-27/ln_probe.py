"""layer_norm and softmax bf16 4096x4096, ours and Liger-Kernel's: per-kernel us and GB/s; with an argument, one call of
each inside an NVTX range of its name, for Nsight Compute (COMMAND.txt). Run from the repository root."""
import sys, torch
sys.path.insert(0, "bench")
from diag_norm_split import per_kernel
from opsmith import ops
from opsmith.ops import _norms, _functional as fn
from liger_kernel.ops.layer_norm import layer_norm_forward
from liger_kernel.ops.softmax import _softmax_forward
rows, cols = 4096, 4096
x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
w, b = torch.randn(cols, device="cuda", dtype=x.dtype), torch.randn(cols, device="cuda", dtype=x.dtype)
cases = {"ln_ours": lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0],
         "ln_liger": lambda: layer_norm_forward(x, w, b, 1e-5),
         "sm_ours": lambda: fn.softmax_cuda(x, -1),
         "sm_liger": lambda: _softmax_forward(x),
         "copy": lambda: x.clone()}
for k, f in cases.items():
    f()
    print(k, {n: round(v, 2) for n, v in per_kernel(f).items()}, round(ops.benchmark(f, bytes_moved=2 * x.nbytes, runs=300).gbps))
if len(sys.argv) > 1:
    torch.cuda.synchronize()
    for k in ("ln_ours", "ln_liger", "sm_ours", "sm_liger"):
        torch.cuda.nvtx.range_push(k); cases[k](); torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
