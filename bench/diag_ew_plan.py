"""Which grid makes opsmith.ops' elementwise kernels fastest on this GPU? (a diagnostic)

Times relu/gelu/silu forward and backward at 512 MiB (fp32) and bf16 under three grid
policies for the same kernels: one wave of resident blocks (grid-stride), one trip per thread
with the kernel's 4 vectors in flight (many waves), and one vector per thread.
    python3 bench/diag_ew_plan.py
"""
from __future__ import annotations

import torch

import opsmith.ops as ops
from opsmith.ops import _launch, _functional


def main() -> None:
    torch.manual_seed(0)
    orig = _launch.elementwise_plan.__wrapped__
    UNROLL = 4

    def trip(n, itemsize, props):
        vec = 16 // itemsize
        threads = min(_launch.EW_THREADS, props.max_threads_per_block)
        grid = max(1, _launch._cdiv(n, vec * threads * UNROLL))
        return _launch.Plan("elementwise", (min(grid, 2**31 - 1),), (threads,), 0, 0)

    def one(n, itemsize, props):
        vec = 16 // itemsize
        threads = min(_launch.EW_THREADS, props.max_threads_per_block)
        return _launch.Plan("elementwise", (min(max(1, _launch._cdiv(n, vec * threads)), 2**31 - 1),), (threads,), 0, 0)

    policies = {"one-wave": orig, "one-trip": trip, "vec-per-thread": one}
    copy = ops.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn((512 << 20) // 2 // torch.tensor([], dtype=dtype).element_size(), device="cuda", dtype=dtype)
        g = torch.randn_like(x)
        for name in ("relu", "gelu_erf", "silu"):
            for direction in ("fwd", "bwd"):
                row = []
                for pol, fn in policies.items():
                    _launch.elementwise_plan = fn
                    if direction == "fwd":
                        r = ops.benchmark(lambda: _functional.ew_fwd(name, x), bytes_moved=2 * x.nbytes, runs=30)
                    else:
                        r = ops.benchmark(lambda: _functional.ew_bwd(name, g, x), bytes_moved=3 * x.nbytes, runs=30)
                    row.append(f"{pol} {r.fraction * 100:5.1f}%")
                _launch.elementwise_plan = orig
                print(f"{name:8s} {direction} {str(dtype)[6:]:9s} " + "  ".join(row), flush=True)

if __name__ == "__main__":
    main()
