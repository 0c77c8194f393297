"""Why bench_ops_peers reads Liger-Kernel's row forwards above a same-size copy at 16-64 MiB: does the time between
the L2 flush and the timed call (opsmith.ops.benchmark's spin, 2x the call's host time + 50 us, so longer for a slower
host path) or the flush's dirty lines decide it? bf16 forwards, median of 100 runs, GB/s of the bytes-moved floor,
under a write flush (buf.zero_(), as opsmith.ops.benchmark) or a read flush (a sum over the buffer, L2 left clean),
and a fixed spin before each timed call. From the repository root, Liger on PYTHONPATH:

    python3 bench/results/ops-ln-late2-h100-2026-11-27/spin.py
"""
import json
import statistics
import sys

import torch

print("importing Liger-Kernel", flush=True)
from liger_kernel.ops.rms_norm import LigerRMSNormFunction  # noqa: E402  (the ops alone: no transformers import)
from liger_kernel.ops.softmax import LigerSoftmaxFunction  # noqa: E402

from opsmith import ops  # noqa: E402
from opsmith.ops import _bench  # noqa: E402

props = torch.cuda.get_device_properties(0)
buf = torch.empty(max(2 * props.L2_cache_size, 64 << 20) // 4, dtype=torch.int32, device="cuda")
acc = torch.empty((), dtype=torch.int64, device="cuda")
FLUSH = {"write": lambda: buf.zero_(), "read": lambda: torch.sum(buf, dim=0, out=acc)}
rate = _bench._spin_rate(0)
print(f"spin rate {rate:.0f} cycles/ms", flush=True)


def times(fn, flush, spin_ms, runs=100):
    for _ in range(3):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(starts, ends):
        flush()
        torch.cuda._sleep(int(rate * spin_ms))
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


out = []
with torch.no_grad():
    for rows, cols in ((2048, 2048), (4096, 4096)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(x)
        impls = {"ours_rms": lambda: ops.rms_norm(x, (cols,), w, 1e-6), "liger_rms": lambda: LigerRMSNormFunction.apply(x, w, 1e-6),
                 "ours_softmax": lambda: ops.softmax(x, -1), "liger_softmax": lambda: LigerSoftmaxFunction.apply(x),
                 "copy": lambda: dst.copy_(x)}
        for rep in range(2):
            for flush in ("write", "read"):
                for spin in (0.05, 0.3, 2.0):
                    row = {"shape": [rows, cols], "rep": rep, "flush": flush, "spin_ms": spin}
                    for name, fn in impls.items():
                        row[name] = round(2 * x.nbytes / (times(fn, FLUSH[flush], spin) * 1e-3) / 1e9)
                    out.append(row)
                    print(row, flush=True)
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "/dev/null", "w"), indent=1)
