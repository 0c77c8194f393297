"""Why Liger's row forwards read faster at 2048x2048 in bench_ops_peers than in the kernel diags: the same
ops through their public entry and raw, ours and Liger's, bf16, L2 flushed, median of 300, twice."""
import sys, torch
sys.path.insert(0, "bench")
from opsmith import ops
from opsmith.ops import _norms, _functional as fn
from liger_kernel.transformers import functional as lf
from liger_kernel.ops.rms_norm import rms_norm_forward
from liger_kernel.ops.layer_norm import layer_norm_forward
from liger_kernel.ops.softmax import _softmax_forward
torch.backends.cudnn.benchmark = False
for rows, cols in ((2048, 2048), (512, 1024), (4096, 4096)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    nb = 2 * x.nbytes
    src = torch.empty(x.nbytes, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    cases = {
        "rms op": lambda: ops.rms_norm(x, (cols,), w, 1e-6), "rms raw": lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6),
        "rms liger fn": lambda: lf.liger_rms_norm(x, w, 1e-6), "rms liger raw": lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None),
        "ln op": lambda: ops.layer_norm(x, (cols,), w, b, 1e-5), "ln raw": lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5),
        "ln liger fn": lambda: lf.liger_layer_norm(x, w, b, 1e-5), "ln liger raw": lambda: layer_norm_forward(x, w, b, 1e-5),
        "sm op": lambda: ops.softmax(x, -1), "sm raw": lambda: fn.softmax_cuda(x, -1),
        "sm liger fn": lambda: lf.liger_softmax(x), "sm liger raw": lambda: _softmax_forward(x),
        "copy": lambda: dst.copy_(src)}
    for rep in range(2):
        with torch.no_grad():
            out = {k: ops.benchmark(f, bytes_moved=nb, runs=300, warmup=3).gbps for k, f in cases.items()}
        print(f"{rows}x{cols} rep{rep} " + " | ".join(f"{k} {v:.0f}" for k, v in out.items()), flush=True)
    # kernel names and times, profiler
    from torch.profiler import profile, ProfilerActivity
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for k in ("rms op", "rms liger fn", "ln op", "ln liger fn", "sm op", "sm liger fn"):
            for _ in range(20):
                cases[k]()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
