"""Where cross_entropy's forward loses at 4096x32000: the op, its two kernels alone, a pure read of the same
logits (torch.amax), a same-size copy; L2 flushed by a write (opsmith.ops.benchmark) and by a read."""
import statistics, sys, json
import torch
from opsmith import ops
from opsmith.ops import _cross_entropy as ce, _launch, _bench

props = torch.cuda.get_device_properties(0)
buf = torch.empty(max(2 * props.L2_cache_size, 64 << 20) // 4, dtype=torch.int32, device="cuda")
acc = torch.empty((), dtype=torch.int64, device="cuda")
FL = {"write": lambda: buf.zero_(), "read": lambda: torch.sum(buf, dim=0, out=acc)}
rate = _bench._spin_rate(0)

def t(fn, flush, runs=100):
    for _ in range(3): fn()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]; en = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(st, en):
        FL[flush](); torch.cuda._sleep(int(rate * 0.3)); s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(st, en)) * 1e3  # us

out = []
with torch.no_grad():
    for rows, V in ((4096, 32000), (8192, 32000), (16384, 32000), (4096, 128256)):
        x = torch.randn(rows, V, device="cuda", dtype=torch.bfloat16)
        tg = torch.randint(0, V, (rows,), device="cuda"); tg[::16] = -100
        p = ce.plan(rows, V, 2, _launch.device_props(0))
        lse = torch.empty(rows, device="cuda"); rl = torch.empty(rows, device="cuda"); part = torch.empty(0, device="cuda")
        cnt = torch.empty(1, device="cuda"); o = torch.empty((), dtype=x.dtype, device="cuda")
        kf, kfin = ce._kernel("fwd", "bfloat16", 0), ce._kernel("finish", "bfloat16", 0)
        fwd = lambda: kf.launch(_launch.launch_config(p.fwd), x, tg, part, lse, rl, rows, V, p.chunk, -100, 0.0, 0.0)
        fin = lambda: kfin.launch(_launch.launch_config(p.finish), x, tg, part, lse, rl, o, cnt, rows, V, p.chunk, -100, 0.0, 0.0, 1)
        half = torch.empty(x.nbytes // 2, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(half)
        impls = {"op": lambda: ops.cross_entropy(x, tg), "fwd kernel": fwd, "finish kernel": fin,
                 "amax": lambda: torch.amax(x, -1), "copy same bytes": lambda: dst.copy_(half), "empty (spin only)": lambda: None}
        for flush in ("write", "read"):
            for name, fn in impls.items():
                us = t(fn, flush)
                row = {"shape": [rows, V], "flush": flush, "impl": name, "us": us, "gbps": x.nbytes / us / 1e3}
                out.append(row); print(f"{rows}x{V} {flush:5} {name:18} {us:8.1f} us {x.nbytes/us/1e3:6.0f} GB/s", flush=True)
        print("plan", p, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
