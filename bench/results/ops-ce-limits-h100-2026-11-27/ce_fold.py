"""cross_entropy's forward with the reduction in its last block (the op now) against the forward + finishing-block
launches it replaces (bdcb865's cross_entropy.cu, compiled here), bf16, every 16th row ignored, mean; torch's row sums
and a copy of the same bytes beside. L2 flushed (opsmith.ops.benchmark, median of 100, 3 rounds in turn).
"new" is the op of the tree it runs in: ce_fold.json was measured on a tree with ce_fold.patch applied (it lost:
not committed); run at HEAD, both sides are the forward + finishing block."""
import json, os, statistics, subprocess
from pathlib import Path
import torch
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _cross_entropy as ce, _launch, _sources
from opsmith._runtime._launch_config import LaunchConfig

src = subprocess.run(["git", "show", "bdcb865:opsmith/ops/kernels/cross_entropy.cu"], capture_output=True, text=True,
                     check=True, cwd=Path(__file__).resolve().parents[3]).stdout  # the forward + finishing block
names = ["cross_entropy_fwd<__nv_bfloat16, float, false>", "cross_entropy_finish<__nv_bfloat16, float>"]
m = CudaModule(src, name_expressions=names, arch=_driver.device_arch(0), name="diag/ce_old.cu",
               include_paths=[str(_sources.KERNEL_DIR)])
old_fwd, old_fin = m.get_kernel(names[0]), m.get_kernel(names[1])
out = []
for rows, V in ((4096, 32000), (8192, 32000), (16384, 32000), (4096, 128256), (512, 128256), (8, 128256), (64, 32000)):
    x = torch.randn(rows, V, device="cuda", dtype=torch.bfloat16)
    tg = torch.randint(0, V, (rows,), device="cuda"); tg[::16] = -100
    p = ce.plan(rows, V, 2, _launch.device_props(0))
    per_row = -(-V // p.chunk)
    part = torch.empty(3 * rows * per_row if per_row > 1 else 0, device="cuda")
    lse, rl = torch.empty(rows, device="cuda"), torch.empty(rows if per_row == 1 else 0, device="cuda")
    o, cnt = torch.empty((), device="cuda", dtype=torch.bfloat16), torch.empty(1, device="cuda")
    fcfg, ficfg = LaunchConfig(p.fwd.grid, p.fwd.block, 0), LaunchConfig((1,), (1024,), 0)

    def old():
        old_fwd.launch(fcfg, x, tg, part, lse, rl, rows, V, p.chunk, -100, 0.0, 0.0)
        old_fin.launch(ficfg, x, tg, part, lse, rl, o, cnt, rows, V, p.chunk, -100, 0.0, 0.0, 2)
    old(); new = ops.cross_entropy(x, tg); torch.cuda.synchronize()
    torch.testing.assert_close(o.float(), new.float(), atol=0, rtol=8e-3)
    half = torch.empty(x.nbytes // 2, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(half)
    calls = {"old: fwd + finish": old, "new: one launch (op)": lambda: ops.cross_entropy(x, tg),
             "torch row sums": lambda: torch.sum(x, dim=-1, dtype=torch.float32), "copy same bytes": lambda: dst.copy_(half)}
    per = {n: [] for n in calls}
    for r in range(3):
        for n in list(calls)[r:] + list(calls)[:r]:
            per[n].append(ops.benchmark(calls[n], runs=100).median_ms * 1e3)
    for n, us in per.items():
        med = statistics.median(us)
        out.append({"shape": [rows, V], "variant": n, "us": med, "rounds_us": us})
        print(f"{rows}x{V} {n:22} {med:8.1f} us {x.nbytes / med / 1e3:6.0f} GB/s  rounds {[round(u, 1) for u in us]}",
              flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "ce_fold.json"), "w"), indent=1)
