"""softmax's fp32 rows of 16,385-32,768 (64-128 KiB): the shipped plans (forward: the long rows from a shared-memory
copy; backward: the long rows read twice) against one block of 1024 threads a row holding it in registers, 8 chunks
a thread (softmax_fwd_any<8> / softmax_bwd_any<8>, appended to a copy of softmax.cu), and Liger's. Kernels' calls
alone (CUDA events, L2 flushed, opsmith.ops.benchmark, median of 50, 3 rounds in turn)."""
import json, os, statistics
import torch
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _functional as fn, _sources
from opsmith._runtime._launch_config import LaunchConfig
from liger_kernel.ops.softmax import LigerSoftmaxFunction

EXTRA = '''
template <class T>
__global__ void __launch_bounds__(1024, 1)
softmax_fwd_wide8(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_any<8>(x, y, rows, cols);
}
template <class T>
__global__ void __launch_bounds__(1024, 1)
softmax_bwd_wide8(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x, long long rows,
                  int cols) {
    softmax_bwd_any<8>(grad_y, y, grad_x, rows, cols);
}
'''
names = ["softmax_fwd_wide8<float>", "softmax_bwd_wide8<float>"]
m = CudaModule((_sources.KERNEL_DIR / "softmax.cu").read_text() + EXTRA, name_expressions=names,
               arch=_driver.device_arch(0), name="diag/softmax8.cu", include_paths=[str(_sources.KERNEL_DIR)],
               options=["--ptxas-options=-v"])
print([l.strip()[-80:] for l in m.binary.log.splitlines() if "spill" in l or "Used" in l])
f8, b8 = m.get_kernel(names[0]), m.get_kernel(names[1])
out = []
for rows, cols in ((2048, 32768), (4096, 32768), (1024, 32768), (4096, 20000), (4096, 16385)):
    x = torch.randn(rows, cols, device="cuda")
    g = torch.randn_like(x)
    y = torch.softmax(x, -1)
    cfg = LaunchConfig((rows,), (1024,), 0)
    y8, dx8 = torch.empty_like(x), torch.empty_like(x)
    f8.launch(cfg, x, y8, rows, cols); b8.launch(cfg, g, y, dx8, rows, cols); torch.cuda.synchronize()
    torch.testing.assert_close(y8, y, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dx8, fn.softmax_bwd(g, y), atol=1e-6, rtol=1e-5)
    calls = {"shipped fwd": lambda: fn.softmax_fwd(x), "wide8 fwd": lambda: f8.launch(cfg, x, y8, rows, cols),
             "liger fwd": lambda: LigerSoftmaxFunction.apply(x),
             "shipped bwd": lambda: fn.softmax_bwd(g, y), "wide8 bwd": lambda: b8.launch(cfg, g, y, dx8, rows, cols)}
    per = {n: [] for n in calls}
    for r in range(3):
        for n in list(calls)[r:] + list(calls)[:r]:
            per[n].append(ops.benchmark(calls[n], runs=50).median_ms * 1e3)
    for n, us in per.items():
        med = statistics.median(us)
        gbps = (2 if "fwd" in n else 3) * x.nbytes / med / 1e3
        out.append({"shape": [rows, cols], "variant": n, "us": med, "gbps": gbps, "rounds_us": us})
        print(f"fp32 {rows}x{cols} {n:12} {med:8.1f} us {gbps:6.0f} GB/s  rounds {[round(u, 1) for u in us]}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "softmax8.json"), "w"), indent=1)
