"""add_rms_norm bf16 512x1024 / 2048x2048: ours (add_rms_norm_fwd_full) and Liger's forward, one call each in NVTX ranges
for Nsight Compute (COMMAND.txt). Run from the repository root."""
import sys, torch
sys.path.insert(0, "bench")
from opsmith.ops import _fused
from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
for rows, cols in ((512, 1024), (2048, 2048)):
    x, res = (torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    cases = {f"ar_ours_{rows}": lambda: _fused.add_rms_norm_cuda(x, res, [cols], w, 1e-6),
             f"ar_liger_{rows}": lambda: fused_add_rms_norm_forward(x, res, w, 1e-6, 0.0, "llama")}
    for k, f in cases.items():
        f(); f()
    torch.cuda.synchronize()
    for k, f in cases.items():
        torch.cuda.nvtx.range_push(k); f(); torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
