"""rotary fwd: ours and compile each on two sets of inputs made the sweep's way (A made first, then B), same process,
rotating order, opsmith.ops.benchmark median of 40 (L2 flushed), 3 rounds; and the addresses."""
import statistics, sys, torch
sys.path.insert(0, "bench")
import bench_ops_peers as bp
from opsmith import ops

torch._dynamo.config.recompile_limit = 64
im = bp.impls("rotary", None)
for dt, (r, c) in ((torch.float32, (2048, 2048)), (torch.float16, (16384, 4096)), (torch.float32, (4096, 4096)),
                   (torch.float32, (8192, 8192))):
    torch.manual_seed(0)
    A = im["opsmith"][0](r, c, dt, "cuda", False)
    torch.manual_seed(0)
    B = im["opsmith"][0](r, c, dt, "cuda", False)
    torch._dynamo.reset()
    comp = torch.compile(im["eager"][1], dynamic=False)
    calls = {}
    for tag, t in (("A", A), ("B", B)):
        calls["ours " + tag] = lambda t=t: ops.rotary_embedding_qk(*t)
        calls["compile " + tag] = lambda t=t: comp(*t)
    per = {n: [] for n in calls}
    with torch.no_grad():
        for f in calls.values():
            f()
        for rnd in range(4):
            nm = list(calls)
            for n in nm[rnd:] + nm[:rnd]:
                per[n].append(ops.benchmark(calls[n], runs=40).median_ms * 1e3)
    addr = " ".join(f"{tag}:" + ",".join(hex(x.data_ptr() >> 20) for x in t[:2]) for tag, t in (("A", A), ("B", B)))
    print(str(dt)[6:], f"{r}x{c}", " | ".join(f"{n} {statistics.median(v):7.2f}us" for n, v in per.items()),
          "| MiB", addr, flush=True)
    del A, B
