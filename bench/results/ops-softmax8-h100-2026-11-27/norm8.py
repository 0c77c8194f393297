"""The norm forwards' float rows of 32,768 (128 KiB) at one block of 1,024 threads of 8 chunks a thread (the row
in registers, read once; full rows only: layer_norm with its weight and bias read a chunk at a time, LATE = 2;
rms_norm as its register row; both spill at 64 registers) against the shipped L2 rows (read twice). Kernels
appended to a copy of norm.cu; L2 flushed, opsmith.ops.benchmark, median of 50, 3 rounds in turn."""
import json, os, statistics, sys
from pathlib import Path
import torch
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _norms, _sources
from opsmith._runtime._launch_config import LaunchConfig

sys.path.insert(0, str(Path(__file__).parent))  # regs3.py beside it: the kernels
from regs3 import EXTRA, names  # noqa: E402
m = CudaModule((_sources.KERNEL_DIR / "norm.cu").read_text() + EXTRA, name_expressions=names,
               arch=_driver.device_arch(0), name="diag/norm8.cu", include_paths=[str(_sources.KERNEL_DIR)])
ln8, rms8 = m.get_kernel(names[0]), m.get_kernel(names[1])
out = []
for rows, cols in ((2048, 32768), (4096, 32768)):
    x = torch.randn(rows, cols, device="cuda"); w = torch.randn(cols, device="cuda"); b = torch.randn(cols, device="cuda")
    cfg = LaunchConfig((rows,), (1024,), 0)
    y, mean, rstd = torch.empty_like(x), torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
    rms8.launch(cfg, x, w, y, rstd, rows, cols, 1e-6, 1); torch.cuda.synchronize()
    torch.testing.assert_close(y, _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0], atol=1e-5, rtol=1e-5)
    ln8.launch(cfg, x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1); torch.cuda.synchronize()
    torch.testing.assert_close(y, _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0], atol=1e-5, rtol=1e-5)
    calls = {"rms shipped": lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6),
             "rms 8x1024": lambda: rms8.launch(cfg, x, w, y, rstd, rows, cols, 1e-6, 1),
             "ln shipped": lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5),
             "ln 8x1024": lambda: ln8.launch(cfg, x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1)}
    per = {n: [] for n in calls}
    for r in range(3):
        for n in list(calls)[r:] + list(calls)[:r]:
            per[n].append(ops.benchmark(calls[n], runs=50).median_ms * 1e3)
    for n, us in per.items():
        med = statistics.median(us)
        out.append({"shape": [rows, cols], "variant": n, "us": med, "gbps": 2 * x.nbytes / med / 1e3, "rounds_us": us})
        print(f"fp32 {rows}x{cols} {n:12} {med:8.1f} us {2 * x.nbytes / med / 1e3:6.0f} GB/s", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "norm8.json"), "w"), indent=1)
