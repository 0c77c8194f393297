"""Does fetching the kernel's code from DRAM (the L2 flush evicts it) cost small ops? Each op is timed after the
write flush and a spin (0.5 ms), as opsmith.ops.benchmark does, and again with a 1-row call of the same op (same
kernel, same width) between the spin and the start event: its code is then in L2, its inputs still in DRAM."""
import json, statistics, sys
import torch
from liger_kernel.transformers import functional as lf
from opsmith import ops
from opsmith.ops import _bench

props = torch.cuda.get_device_properties(0)
buf = torch.empty(max(2 * props.L2_cache_size, 64 << 20) // 4, dtype=torch.int32, device="cuda")
rate = _bench._spin_rate(0)

def times(fn, warm, runs=200):
    for _ in range(3):
        fn(); warm and warm()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]; en = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(st, en):
        buf.zero_(); torch.cuda._sleep(int(rate * 0.5))
        if warm: warm()
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(st, en))

def cases(rows, cols):
    g = lambda r, c: torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    x, r, x1, r1 = g(rows, cols), g(rows, cols), g(1, cols), g(1, cols)
    xx, xx1 = g(rows, 2 * cols), g(1, 2 * cols)
    a, b, a1, b1 = g(rows, cols), g(rows, cols), g(1, cols), g(1, cols)
    n = x.nbytes
    return {
        "add_rms ours": (4 * n, lambda x, r: ops.add_rms_norm(x, r, (cols,), w, 1e-6), (x, r), (x1, r1)),
        "add_rms liger": (4 * n, lambda x, r: lf.liger_fused_add_rms_norm(x, r, w, 1e-6, in_place=False), (x, r), (x1, r1)),
        "rms ours": (2 * n, lambda x: ops.rms_norm(x, (cols,), w, 1e-6), (x,), (x1,)),
        "rms liger": (2 * n, lambda x: lf.liger_rms_norm(x, w, 1e-6), (x,), (x1,)),
        "softmax ours": (2 * n, lambda x: ops.softmax(x, -1), (x,), (x1,)),
        "softmax liger": (2 * n, lambda x: lf.liger_softmax(x), (x,), (x1,)),
        "silu ours": (3 * n, lambda x: ops.silu_and_mul(x), (xx,), (xx1,)),
        "silu liger": (3 * n, lambda a, b: lf.liger_swiglu(a, b), (a, b), (a1, b1)),
        "copy": (2 * n, lambda x: torch.empty_like(x).copy_(x) if False else y.copy_(x), (x,), (x1,)),
    }

out = []
with torch.no_grad():
    for rows, cols in ((512, 1024), (2048, 2048), (4096, 4096)):
        y = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
        cs = cases(rows, cols)
        for rep in range(2):
            for name, (nb, fn, args, small) in cs.items():
                if name == "copy":
                    y1 = torch.empty(1, cols, device="cuda", dtype=torch.bfloat16)
                    cold = times(lambda: y.copy_(args[0]), None); warm = times(lambda: y.copy_(args[0]), lambda: y1.copy_(small[0]))
                else:
                    cold = times(lambda: fn(*args), None); warm = times(lambda: fn(*args), lambda: fn(*small))
                row = {"shape": [rows, cols], "rep": rep, "impl": name, "cold_us": cold * 1e3, "warm_us": warm * 1e3,
                       "cold_gbps": nb / cold / 1e6, "warm_gbps": nb / warm / 1e6}
                out.append(row)
                print(f"{rows}x{cols} r{rep} {name:<14} cold {cold*1e3:7.2f} us {nb/cold/1e6:6.0f} GB/s   code warm {warm*1e3:7.2f} us {nb/warm/1e6:6.0f} GB/s", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
