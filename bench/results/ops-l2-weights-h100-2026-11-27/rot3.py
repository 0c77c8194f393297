"""rotary fwd+bwd as bench_ops_peers times it: the GPU kernels of one step (torch.profiler) for opsmith and compile,
and ours against compile with q and k placed at chosen offsets of one buffer (fwd)."""
import statistics, sys, torch
sys.path.insert(0, "bench")
import bench_ops_peers as bp
from opsmith import ops
from torch.profiler import profile, ProfilerActivity

torch._dynamo.config.recompile_limit = 64
im = bp.impls("rotary", None)
for dt, (r, c) in ((torch.float32, (8192, 8192)), (torch.float32, (2048, 2048)), (torch.float16, (16384, 4096))):
    for name in ("opsmith", "compile"):
        make, fn = im[name]
        step = bp.prepare(name, make, fn, r, c, dt, "cuda", "fwd+bwd")
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.count:
                rows.append(f"{e.key[:60]} x{e.count // 5} {e.device_time_total / e.count:.1f}us")
        print(str(dt), r, c, name, " | ".join(rows), flush=True)
# placement: q at 0, k at delta bytes further, in one buffer (fp32 2048x2048: q and k 16 MiB each)
heads, seq = 16, 2048
n = heads * seq * 128
comp = torch.compile(bp.impls("rotary", None)["eager"][1], dynamic=False)
ang = torch.randn(seq, 64, device="cuda"); cs, sn = ang.cos(), ang.sin()
for delta_mib in (16, 17, 18, 20, 24, 32, 48):
    buf = torch.randn(n + delta_mib * (1 << 18) + n, device="cuda")
    off = delta_mib * (1 << 18)
    q = buf[:n].view(1, heads, seq, 128); k = buf[off:off + n].view(1, heads, seq, 128)
    res = {"ours": [], "compile": []}
    for rnd in range(3):
        with torch.no_grad():
            res["ours"].append(ops.benchmark(lambda: ops.rotary_embedding_qk(q, k, cs, sn), runs=40).median_ms * 1e3)
            res["compile"].append(ops.benchmark(lambda: comp(q, k, cs, sn), runs=40).median_ms * 1e3)
    o, cc = statistics.median(res["ours"]), statistics.median(res["compile"])
    print(f"k at q + {delta_mib} MiB: ours {o:.2f} us, compile {cc:.2f} us, ratio {cc / o:.3f}", flush=True)
    del buf, q, k
