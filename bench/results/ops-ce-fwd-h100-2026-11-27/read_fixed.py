"""Is the ~18 us that cross_entropy's forward pays beyond a copy a cost of read-only kernels? Time (write flush,
opsmith.ops.benchmark, median of 100, 3 rounds) pure reads of the same logits at 4096/8192/16384 x 32000 bf16:
a full 1-D sum, a per-row sum, the op's forward, and a copy of the same bytes; the intercept of time against
rows tells the fixed part."""
import statistics
import torch
from opsmith import ops
acc = {}
for rows in (4096, 8192, 16384):
    x = torch.randn(rows, 32000, device="cuda", dtype=torch.bfloat16)
    tg = torch.randint(0, 32000, (rows,), device="cuda")
    half = torch.empty(x.nbytes // 2, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(half)
    out1 = torch.empty((), device="cuda", dtype=torch.float32)
    calls = {"sum all": lambda: torch.sum(x.view(-1), dtype=torch.float32),
             "sum rows": lambda: torch.sum(x, dim=-1, dtype=torch.float32),
             "ce fwd op": lambda: ops.cross_entropy(x, tg), "copy": lambda: dst.copy_(half)}
    per = {n: [] for n in calls}
    for r in range(3):
        for n in list(calls)[r:] + list(calls)[:r]:
            per[n].append(ops.benchmark(calls[n], bytes_moved=x.nbytes, runs=100).median_ms * 1e3)
    for n, us in per.items():
        acc.setdefault(n, []).append(statistics.median(us))
        print(f"{rows}x32000 {n:10} {statistics.median(us):8.1f} us {x.nbytes / statistics.median(us) / 1e3:6.0f} GB/s", flush=True)

for n, us in acc.items():
    slope = (us[2] - us[0]) / 3  # per 4096 rows
    print(f"{n:10} per 4096 rows {slope:6.1f} us, intercept {us[0] - slope:5.1f} us")
