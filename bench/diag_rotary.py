#!/usr/bin/env python3
"""rotary.cu compiled with 1, 2 or 4 rows a thread per trip (``OPSMITH_ROTARY_ROWS``; ``--blocks``: also 2
rows with ``OPSMITH_ROTARY_BLOCKS`` minimum blocks an SM, a register cap), the kernel
alone on q-like tensors [1, heads, seq, 128] bf16 with cos/sin [seq, 64] (CUDA events, median, L2
flushed), GB/s of x read and y written; ``--ncu`` runs one launch of the shipped build for
Nsight Compute (``ncu --section ... python3 bench/diag_rotary.py --ncu``).

    python3 bench/diag_rotary.py --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from _kernel_timing import median_us  # noqa: E402  (bench/ is the script's folder)
from opsmith.ops import _launch, _rotary, _sources  # noqa: E402

SHAPES = [(16384, 32), (4096, 32), (65536, 8)]  # (seq, heads)




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--blocks", default="", help="also OPSMITH_ROTARY_BLOCKS values (comma-separated) at 2 rows a trip")
    args = ap.parse_args()
    if args.ncu:
        q = torch.randn(1, 32, 16384, 128, dtype=torch.bfloat16, device="cuda")
        ang = torch.randn(16384, 64, device="cuda")
        c, s = ang.cos().to(q.dtype), ang.sin().to(q.dtype)
        for _ in range(2):
            ops.rotary_embedding(q, c, s)
        torch.cuda.synchronize()
        return 0
    arch, props = _driver.device_arch(0), _launch.device_props(0)
    names = _sources.kernel_names("rotary.cu", "bfloat16")
    out = []
    configs = [(1, None), (2, None), (4, None)] + [(2, int(b)) for b in args.blocks.split(",") if b]
    for rows_per, blocks in configs:
        defines = {"OPSMITH_ROTARY_ROWS": rows_per, **({"OPSMITH_ROTARY_BLOCKS": blocks} if blocks else {})}
        mod = CudaModule(_sources.KERNEL_DIR / "rotary.cu", name_expressions=names, arch=arch,
                         defines=defines, name=f"diag-rotary-{rows_per}-{blocks}")
        k = mod.get_kernel(names[0])
        for seq, heads in SHAPES:
            q = torch.randn(1, heads, seq, 128, dtype=torch.bfloat16, device="cuda")
            y = torch.empty_like(q)
            ang = torch.randn(seq, 64, device="cuda")
            c, s = ang.cos().to(q.dtype), ang.sin().to(q.dtype)
            half, lead = _rotary._checked(q, c, s, None)
            pos = torch.zeros(1, dtype=torch.long, device="cuda")
            rows = q.numel() // 128
            base = _rotary._plan(rows, 128, half, 2, props)
            for grid_div in (1, rows_per):
                grid = max(1, -(-base.grid[0] // grid_div))
                cfg = _launch.launch_config(_launch.Plan("rows", (grid,), base.block, 0, 0))

                def fn():
                    k.launch(cfg, q, c, s, pos, y, rows, 128, half, 0, 1, 0, *lead)  # noqa: B023
                us = median_us(fn, args.runs)
                gbps = 2 * q.numel() * 2 / us / 1e3
                out.append({"rows_per_trip": rows_per, "blocks": blocks, "grid": grid, "shape": [1, heads, seq, 128], "us": us,
                            "gbps": gbps})
                print(f"R={rows_per} blocks {blocks} grid {grid:7d} [1,{heads},{seq},128]: {gbps:6.0f} GB/s", flush=True)
                if rows_per == 1:
                    break
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": out}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
