"""rotary fwd at fp32 2048x2048 and fp16 16384x4096: bench_ops_peers' own calls (impls + prepare) timed its way (_time,
20 runs, warmup 3) and with 40 runs / warmup 10, and a fresh call on the same tensors; same process, 3 rounds."""
import statistics, sys, torch
sys.path.insert(0, "bench")
import bench_ops_peers as bp
from opsmith import ops

liger = None
for dt, (r, c) in ((torch.float32, (2048, 2048)), (torch.float16, (16384, 4096)), (torch.float32, (8192, 8192))):
    im = bp.impls("rotary", liger)
    calls = {}
    for name in ("opsmith", "compile"):
        make, fn = im[name]
        calls[name] = bp.prepare(name, make, fn, r, c, dt, "cuda", "fwd")
    nb = bp.floor_bytes("rotary", r, c, torch.tensor([], dtype=dt).element_size(), "fwd")
    res = {}
    for rnd in range(3):
        for name, f in calls.items():
            res.setdefault(name + " bench", []).append(bp._time(f, nb, 20, "cuda")["ms"] * 1e3)
            res.setdefault(name + " 40/10", []).append(ops.benchmark(f, runs=40).median_ms * 1e3)
            res.setdefault(name + " 40/3", []).append(ops.benchmark(f, runs=40, warmup=3).median_ms * 1e3)
            res.setdefault(name + " noflush", []).append(ops.benchmark(f, runs=40, flush_l2=False).median_ms * 1e3)
    print(str(dt), r, c, " | ".join(f"{k} {statistics.median(v):6.2f}us" for k, v in res.items()), flush=True)
