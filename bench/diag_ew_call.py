#!/usr/bin/env python3
"""Does the torch op (C++ implementation) cost GPU time beyond its kernel? (a diagnostic)

For relu and the erf GELU at 2 and 32 MiB moved (fp32, bf16): the kernels one call of ``opsmith.ops.relu``
launches (torch.profiler), and :func:`opsmith.ops.benchmark` of the op, of ``_functional.ew_fwd`` (the
Python path, same kernel and plan) and of torch eager, in three alternating rounds.

    python3 bench/diag_ew_call.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opsmith.ops as ops  # noqa: E402
from opsmith.ops import _functional  # noqa: E402


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    for dtype in (torch.float32, torch.bfloat16):
        for mib in (2, 32):
            x = torch.randn((mib << 20) // 2 // dtype.itemsize, device="cuda", dtype=dtype)
            impls = {"relu op": lambda: ops.relu(x), "relu py": lambda: _functional.ew_fwd("relu", x),
                     "relu eager": lambda: torch.relu(x), "gelu op": lambda: ops.gelu(x),
                     "gelu py": lambda: _functional.ew_fwd("gelu_erf", x),
                     "gelu eager": lambda: torch.nn.functional.gelu(x)}
            for name in ("relu op", "gelu op"):
                impls[name]()
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    impls[name]()
                    torch.cuda.synchronize()
                kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                print(f"{str(dtype)[6:]} {mib} MiB {name}: kernels {kernels}", flush=True)
            us = {k: [] for k in impls}
            for _ in range(3):
                for k, f in impls.items():
                    us[k].append(ops.benchmark(f, bytes_moved=2 * x.nbytes, runs=50).median_ms * 1e3)
            print(f"{str(dtype)[6:]} {mib} MiB " + "  ".join(f"{k} {min(v):.2f}/{max(v):.2f}us" for k, v in us.items()),
                  flush=True)


if __name__ == "__main__":
    main()
