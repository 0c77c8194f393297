"""Does bench_ops_peers' timing read some implementations too fast at 16-64 MiB? Its order (opsmith, eager, compile,
liger, copy), runs=20, L2 flushed by zero_ (opsmith.ops.benchmark) against other flushes and 300 runs."""
import statistics, sys, torch
import torch.nn.functional as F
sys.path.insert(0, "bench")
from opsmith import ops
from opsmith.ops import _bench
from liger_kernel.transformers import functional as lf

dev = 0
L2 = torch.cuda.get_device_properties(0).L2_cache_size
big = torch.empty(max(2 * L2, 64 << 20) // 4, dtype=torch.int32, device="cuda")
big4 = torch.empty(4 * L2 // 4, dtype=torch.int32, device="cuda")
FLUSH = {"zero": lambda: big.zero_(), "add1": lambda: big.add_(1), "zero4x": lambda: big4.zero_(),
         "fill7": lambda: big.fill_(7)}

def gbps(fn, nb, runs, flush):
    t = _bench._times(fn, runs, 3, FLUSH[flush], dev)
    return nb / (statistics.median(t) * 1e-3) / 1e9, nb / (min(t) * 1e-3) / 1e9, nb / (max(t) * 1e-3) / 1e9

for rows, cols in ((2048, 2048), (4096, 4096)):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    nb = 2 * x.nbytes
    src = torch.empty(x.nbytes, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    torch._dynamo.reset()
    comp = torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)
    cases = {"ours": lambda: ops.rms_norm(x, (cols,), w, 1e-6), "eager": lambda: F.rms_norm(x, (cols,), w, 1e-6),
             "compile": lambda: comp(x, w), "liger": lambda: lf.liger_rms_norm(x, w, 1e-6), "copy": lambda: dst.copy_(src),
             "ln ours": lambda: ops.layer_norm(x, (cols,), w, b, 1e-5), "ln liger": lambda: lf.liger_layer_norm(x, w, b, 1e-5)}
    with torch.no_grad():
        for f in cases.values():
            f()
        for flush in FLUSH:
            for runs in (20, 300):
                for rep in range(2 if runs == 20 else 1):
                    out = {k: gbps(f, nb, runs, flush) for k, f in cases.items()}
                    print(f"{rows}x{cols} flush {flush:6} runs {runs:3} rep{rep}: " + " | ".join(
                        f"{k} {m:.0f} ({lo:.0f}-{hi:.0f})" for k, (m, hi, lo) in out.items()), flush=True)
