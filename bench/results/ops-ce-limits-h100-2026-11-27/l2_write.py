"""Why cross_entropy's forward (a pure read of the logits) reads below a same-size copy at 4096-8192 x 32000:
time it, torch's row sums and a copy of the same bytes three ways, 3 rounds in turn, median of 100 each:
 write: opsmith.ops.benchmark as shipped (the flush zero_()s 2 x L2: L2 left full of dirty lines);
 read:  the flush reads the buffer instead (L2 left clean);
 drain: read flush, then the call followed by a 2 x L2 read in the timed region, less that read alone
        (every dirty line the call left in L2 is written back inside the timing)."""
import json, os, statistics
import torch
from opsmith import ops
from opsmith.ops import _bench

dev = 0
props = torch.cuda.get_device_properties(dev)
size = max(2 * props.L2_cache_size, 64 << 20)
fbuf = torch.ones(size // 4, dtype=torch.int32, device="cuda")
drain_buf = torch.ones(size // 4, dtype=torch.int32, device="cuda")
write_flush = _bench._l2_flusher


def read_flusher(device):
    return lambda: fbuf.sum()


def t(fn, kind):
    _bench._l2_flusher = write_flush if kind == "write" else read_flusher
    if kind == "drain":
        both = ops.benchmark(lambda: (fn(), drain_buf.sum()), runs=100).median_ms
        alone = ops.benchmark(lambda: drain_buf.sum(), runs=100).median_ms
        return (both - alone) * 1e3
    return ops.benchmark(fn, runs=100).median_ms * 1e3


res = []
for rows in (4096, 8192, 16384):
    x = torch.randn(rows, 32000, device="cuda", dtype=torch.bfloat16)
    tg = torch.randint(0, 32000, (rows,), device="cuda")
    half = torch.randn(x.nbytes // 2 // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(half)
    calls = {"ce fwd": lambda: ops.cross_entropy(x, tg), "sum rows": lambda: torch.sum(x, dim=-1, dtype=torch.float32),
             "copy": lambda: dst.copy_(half)}
    for kind in ("write", "read", "drain"):
        per = {n: [] for n in calls}
        for r in range(3):
            for n in list(calls)[r:] + list(calls)[:r]:
                per[n].append(t(calls[n], kind))
        for n, us in per.items():
            m = statistics.median(us)
            res.append({"rows": rows, "flush": kind, "call": n, "us": m, "rounds": us})
            print(f"{rows}x32000 {kind:6} {n:9} {m:8.1f} us  {x.nbytes / m / 1e3:6.0f} GB/s", flush=True)
_bench._l2_flusher = write_flush
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
json.dump({"device": torch.cuda.get_device_name(), "rows": res},
          open(os.path.join(os.environ.get("OUT", "."), "l2_write.json"), "w"))
print("\nce fwd / copy of the same bytes, by time (1.0 = as fast as the copy):")
for rows in (4096, 8192, 16384):
    line = [f"{rows}x32000"]
    for kind in ("write", "read", "drain"):
        d = {r["call"]: r["us"] for r in res if r["rows"] == rows and r["flush"] == kind}
        line.append(f"{kind} {d['copy'] / d['ce fwd']:.3f} (ce {d['ce fwd']:.1f} copy {d['copy']:.1f} sum {d['sum rows']:.1f})")
    print("  ".join(line))
