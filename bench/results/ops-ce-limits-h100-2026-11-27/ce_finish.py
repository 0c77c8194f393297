"""cross_entropy's finishing block with its chunk merges' loads 8 chunks at a time and the target's logit loaded
first, against HEAD's (a chunk's loads after the previous chunk's merge): the forward + finishing block of each tree's
cross_entropy.cu, compiled here and launched alike, bf16, every 16th row ignored, mean. L2 flushed
(opsmith.ops.benchmark, median of 100, 3 rounds in turn)."""
import json, os, statistics, subprocess, sys
from pathlib import Path
import torch
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _cross_entropy as ce, _launch, _sources
from opsmith._runtime._launch_config import LaunchConfig

base = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
root = Path(ce.__file__).resolve().parents[2]
srcs = {"before": subprocess.run(["git", "show", f"{base}:opsmith/ops/kernels/cross_entropy.cu"], capture_output=True,
                                 text=True, check=True, cwd=root).stdout,
        "now": (_sources.KERNEL_DIR / "cross_entropy.cu").read_text()}
names = ["cross_entropy_fwd<__nv_bfloat16, float, false>", "cross_entropy_finish<__nv_bfloat16, float>"]
k = {}
for tag, src in srcs.items():
    m = CudaModule(src, name_expressions=names, arch=_driver.device_arch(0), name=f"diag/ce_finish_{tag}.cu",
                   include_paths=[str(_sources.KERNEL_DIR)])
    k[tag] = (m.get_kernel(names[0]), m.get_kernel(names[1]))
out = []
for rows, V in ((1, 262144), (3, 262144), (8, 128256), (64, 128256), (512, 128256), (256, 32000), (4096, 32000)):
    x = torch.randn(rows, V, device="cuda", dtype=torch.bfloat16)
    tg = torch.randint(0, V, (rows,), device="cuda"); tg[1::16] = -100
    p = ce.plan(rows, V, 2, _launch.device_props(0))
    per_row = -(-V // p.chunk)
    calls, res = {}, {}
    for tag, (fwd, fin) in k.items():
        part = torch.empty(3 * rows * per_row if per_row > 1 else 0, device="cuda")
        lse, rl = torch.empty(rows, device="cuda"), torch.empty(rows if per_row == 1 else 0, device="cuda")
        o, cnt = torch.empty((), device="cuda", dtype=torch.bfloat16), torch.empty(1, device="cuda")
        fcfg, ficfg = LaunchConfig(p.fwd.grid, p.fwd.block, 0), LaunchConfig(p.finish.grid, p.finish.block, 0)

        def f(fwd=fwd, fin=fin, part=part, lse=lse, rl=rl, o=o, cnt=cnt, fcfg=fcfg, ficfg=ficfg):
            fwd.launch(fcfg, x, tg, part, lse, rl, rows, V, p.chunk, -100, 0.0, 0.0)
            fin.launch(ficfg, x, tg, part, lse, rl, o, cnt, rows, V, p.chunk, -100, 0.0, 0.0, 2)
        f(); torch.cuda.synchronize()
        calls[tag], res[tag] = f, (o.float().item(), lse.clone(), cnt.item())
    assert res["before"][2] == res["now"][2] and torch.equal(res["before"][1], res["now"][1]), (rows, V)
    assert res["before"][0] == res["now"][0], (rows, V, res["before"][0], res["now"][0])
    calls["op"] = lambda: ops.cross_entropy(x, tg)
    per = {n: [] for n in calls}
    for r in range(3):
        for n in list(calls)[r:] + list(calls)[:r]:
            per[n].append(ops.benchmark(calls[n], runs=100).median_ms * 1e3)
    for n, us in per.items():
        med = statistics.median(us)
        out.append({"shape": [rows, V], "chunks_a_row": per_row, "variant": n, "us": med, "rounds_us": us})
        print(f"{rows}x{V} ({per_row} chunks a row) {n:7} {med:8.1f} us  rounds {[round(u, 1) for u in us]}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "ce_finish.json"), "w"), indent=1)
