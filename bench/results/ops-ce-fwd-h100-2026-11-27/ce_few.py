"""cross_entropy's forward (the op: forward and finishing block) on few rows, where the plan cuts rows into chunks:
as shipped (blocks of 128, 8 an SM) against the plan and kernels before (256, 4 an SM); bf16, 1 target in 16
ignored, write flush, 3 rounds in turn, us."""
import json, statistics, sys
import torch
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _cross_entropy as ce, _sources

src = (_sources.KERNEL_DIR / "cross_entropy.cu").read_text()
names = ["cross_entropy_fwd<__nv_bfloat16, float, false>", "cross_entropy_finish<__nv_bfloat16, float>"]
old = CudaModule(src, name_expressions=names, arch=_driver.device_arch(0), name="diag/ce_old.cu",
                 include_paths=[str(_sources.KERNEL_DIR)], options=["-DOPSMITH_CE_FWD_THREADS=256", "-DOPSMITH_CE_FWD_BLOCKS=4"])
old_k = {"fwd": old.get_kernel(names[0]), "finish": old.get_kernel(names[1])}
shipped_kernel, shipped = ce._kernel, (ce.FWD_THREADS, ce.FWD_BLOCKS)

shipped_plan = ce.plan


def ceil_plan(rows, vocab, itemsize, props):  # 064f204's: rows cut into ceil(resident / rows) chunks
    vec = 16 // itemsize
    p = shipped_plan(rows, vocab, itemsize, props)
    threads = p.fwd.block[0]
    trip = threads * vec * ce.UNROLL
    resident = props.sm_count * max(1, min(ce.FWD_BLOCKS, props.max_threads_per_sm // threads))
    splits = 1
    if rows < resident:
        splits = max(1, min(-(-resident // max(rows, 1)), -(-vocab // trip)))
    chunk = -(-(-(-vocab // splits)) // vec) * vec
    fwd = p.fwd._replace(grid=(max(1, rows * -(-vocab // chunk)),))
    return p._replace(fwd=fwd, chunk=chunk)


def use(v):
    shipped_plan.cache_clear()
    ce.FWD_THREADS, ce.FWD_BLOCKS = (256, 4) if v == "before" else shipped
    ce._kernel = (lambda name, dtype, device, extra="": old_k[name]) if v == "before" else shipped_kernel
    ce.plan = ceil_plan if v != "shipped" else shipped_plan

out = []
for rows, V in ((256, 32000), (512, 32000), (700, 32000), (1024, 32000), (2048, 32000), (8, 128256), (64, 128256),
                (512, 128256), (1024, 128256)):
    x = torch.randn(rows, V, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, V, (rows,), device="cuda"); t[::16] = -100
    res, per = {}, {"before": [], "ceil": [], "shipped": []}
    for v in per:
        use(v); res[v] = ce.cross_entropy_cuda(x, t)[0].item()
        assert abs(res[v] - res["before"]) < 1e-3 * abs(res["before"]), res
    for r in range(3):
        for v in list(per)[r:] + list(per)[:r]:
            use(v)
            per[v].append(ops.benchmark(lambda: ce.cross_entropy_cuda(x, t), runs=100).median_ms * 1e3)
    use("shipped")
    row = {"shape": [rows, V], **{v: statistics.median(us) for v, us in per.items()}, "rounds": per,
           "splits": [-(-V // ce.plan(rows, V, 2, ce._launch.device_props(0)).chunk)]}
    out.append(row)
    print(f"{rows}x{V}: before {row['before']:7.1f} us, 128 x 8 rounding up {row['ceil']:7.1f}, shipped (one wave) "
          f"{row['shipped']:7.1f} ({row['before'] / row['shipped']:.3f}x; splits {row['splits']})", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
