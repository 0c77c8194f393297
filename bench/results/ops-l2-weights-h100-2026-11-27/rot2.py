"""rotary_qk through the op (ops.rotary_embedding_qk, under no_grad, as bench_ops_peers' fwd) against the same
function called directly (_rotary.rotary_qk_cuda), R = 2 rows a trip, and compile; plus the host time of each call.
opsmith.ops.benchmark median (L2 flushed), 3 rounds."""
import json, os, statistics, time, types, torch
from opsmith import ops
from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from opsmith.ops import _rotary, _sources, _launch

torch._dynamo.config.recompile_limit = 64
arch = _driver.device_arch(0)
TN = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
m2 = CudaModule(_sources.KERNEL_DIR / "rotary.cu", name_expressions=[f"rotary_qk<{t}>" for t in TN.values()],
                arch=arch, defines={"OPSMITH_ROTARY_ROWS": 2}, name="probe-rot2-2")
orig_plan, orig_sources = _rotary._plan, _rotary._sources


def r2(q, k, c, s):
    _rotary._plan = lambda *a: (lambda p: p._replace(grid=(-(-p.grid[0] // 2),)))(orig_plan(*a))
    _rotary._sources = types.SimpleNamespace(kernel=lambda fl, n, dt, dev: m2.get_kernel(n.format(T=TN[q.dtype])))
    try:
        return _rotary.rotary_qk_cuda(q, k, c, s)
    finally:
        _rotary._plan, _rotary._sources = orig_plan, orig_sources


def eager_rot(q, k, cos, sin):
    c, s = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    half = lambda t: torch.cat([-t[..., 64:], t[..., :64]], -1)
    return q * c + half(q) * s, k * c + half(k) * s


out = []
for dt in (torch.float32, torch.float16, torch.bfloat16):
    for seq, heads in ((2048, 16), (4096, 32), (8192, 64), (16384, 32), (4096, 128), (2048, 256)):
        torch._dynamo.reset()
        q, k = (torch.randn(1, heads, seq, 128, dtype=dt, device="cuda") for _ in range(2))
        ang = torch.randn(seq, 64, device="cuda"); c, s = ang.cos().to(dt), ang.sin().to(dt)
        comp = torch.compile(eager_rot, dynamic=False)

        def nograd(f):
            def g():
                with torch.no_grad():
                    f(q, k, c, s)
            return g
        calls = {"op": nograd(ops.rotary_embedding_qk), "direct": nograd(_rotary.rotary_qk_cuda),
                 "R2": nograd(r2), "compile": nograd(comp)}
        hosts = {}
        for n, fn in calls.items():
            fn(); torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            hosts[n] = (time.perf_counter() - t) / 200 * 1e6
        per = {n: [] for n in calls}
        for r in range(3):
            nm = list(calls)
            for n in nm[r:] + nm[:r]:
                per[n].append(ops.benchmark(calls[n], runs=40).median_ms * 1e3)
        nb = 4 * q.nbytes + 2 * c.nbytes
        base = statistics.median(per["compile"])
        line = f"{str(dt)[6:]:8} {seq}x{heads * 128}"
        for n, us in per.items():
            med = statistics.median(us)
            out.append({"dtype": str(dt), "seq": seq, "heads": heads, "variant": n, "us": med, "gbps": nb / med / 1e3,
                        "rounds_us": us, "loop_us": hosts[n]})
            line += f" | {n} {nb / med / 1e3:4.0f} {base / med:5.3f} (loop {hosts[n]:4.0f})"
        print(line, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "rot2.json"), "w"), indent=1)
