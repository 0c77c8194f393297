"""rotary fwd in a process like rot5's (the sweep's inputs, ours through the op): ours and compile after three L2
flushes: zero a 256 MiB buffer (opsmith.ops.benchmark's and triton's do_bench's: leaves L2 full of dirty lines),
read one (sum: clean lines), and zero then read another. CUDA events around the call, a spin kernel before it,
median of 40, 3 rounds."""
import statistics, sys, torch
sys.path.insert(0, "bench")
import bench_ops_peers as bp
from opsmith import ops

torch._dynamo.config.recompile_limit = 64
im = bp.impls("rotary", None)
wbuf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
rbuf = torch.ones(64 << 20, dtype=torch.float32, device="cuda")
flushes = {"zero": lambda: wbuf.zero_(), "read": lambda: rbuf.sum(), "zero+read": lambda: (wbuf.zero_(), rbuf.sum())}


def timed(fn, flush, runs=40):
    out = []
    for _ in range(runs + 3):
        flush()
        torch.cuda._sleep(2_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record()
        out.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in out[3:])


for dt, (r, c) in ((torch.float32, (2048, 2048)), (torch.float16, (16384, 4096)), (torch.float32, (4096, 4096))):
    torch.manual_seed(0)
    A = im["opsmith"][0](r, c, dt, "cuda", False)
    torch.manual_seed(0)
    B = im["opsmith"][0](r, c, dt, "cuda", False)
    torch._dynamo.reset()
    comp = torch.compile(im["eager"][1], dynamic=False)
    calls = {"ours": lambda: ops.rotary_embedding_qk(*A), "compile": lambda: comp(*B)}
    res = {}
    with torch.no_grad():
        for f in calls.values():
            f()
        for rnd in range(3):
            for fl, flush in flushes.items():
                for n, f in calls.items():
                    res.setdefault(f"{n} {fl}", []).append(timed(f, flush))
    print(str(dt)[6:], f"{r}x{c}", " | ".join(f"{k} {statistics.median(v):7.2f}us" for k, v in res.items()), flush=True)
