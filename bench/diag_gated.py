#!/usr/bin/env python3
"""gated.cu's kernels (silu_and_mul on separate gate and up tensors, as GatedMLP calls them) compiled
with other minimum blocks an SM (``OPSMITH_GATED_BLOCKS16``: the registers a thread may use) and rows
a thread per trip (``OPSMITH_GATED_ROWS16``; bf16 silu takes both), each timed alone (CUDA events,
median, L2 flushed) with gated_plan's grid for those rows, GB/s of the bytes each must move.

    python3 bench/diag_gated.py --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from _kernel_timing import median_us  # noqa: E402  (bench/ is the script's folder)
from opsmith.ops import _launch, _sources  # noqa: E402

SHAPES = [(4096, 5632), (16384, 5632), (8192, 14336), (65536, 1024)]
CONFIGS = {"r1 b6 (shipped)": (1, 6), "r2 b2": (2, 2), "r2 b4": (2, 4), "r1 b8": (1, 8), "r1 b4": (1, 4)}




def plan(rows: int, d: int, itemsize: int, per_trip: int, props) -> _launch.Plan:
    """gated_plan with ``per_trip`` rows a thread instead of GATED_ROWS."""
    units = max(1, -(-d // (16 // itemsize)))
    threads = min(_launch.EW_THREADS, props.max_threads_per_block)
    tx = min(threads, 1 << max(0, (units - 1).bit_length()))
    ty = threads // tx
    gx = -(-units // tx)
    wave = props.sm_count * max(1, props.max_threads_per_sm // threads)
    one_row = -(-max(rows, 1) // ty)
    gy = min(one_row, max(-(-max(rows, 1) // (ty * per_trip)), -(-wave // gx)))
    return _launch.Plan("gated", (gx, min(gy, 65535)), (tx, ty), 0, 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    arch, props = _driver.device_arch(0), _launch.device_props(0)
    names = _sources.kernel_names("gated.cu", "bfloat16")
    out = []
    for cname, (per_trip, blocks) in CONFIGS.items():
        mod = CudaModule(_sources.KERNEL_DIR / "gated.cu", name_expressions=names, arch=arch,
                         defines={"OPSMITH_GATED_ROWS16": per_trip, "OPSMITH_GATED_BLOCKS16": blocks},
                         name=f"diag-gated-{per_trip}-{blocks}")
        fwd, bwd = mod.get_kernel(names[0]), mod.get_kernel(names[1])
        for rows, d in SHAPES:
            gate = torch.randn(rows, d, dtype=torch.bfloat16, device="cuda")
            up, g = torch.randn_like(gate), torch.randn_like(gate)
            y, dg, du = torch.empty_like(gate), torch.empty_like(gate), torch.empty_like(gate)
            cfg = _launch.launch_config(plan(rows, d, 2, per_trip, props))
            n = gate.numel() * 2
            for name, fn, arrays in (
                    ("fwd", lambda: fwd.launch(cfg, gate, up, y, rows, d, d, d), 3),  # noqa: B023
                    ("bwd", lambda: bwd.launch(cfg, g, gate, up, dg, du, rows, d, d, d, d), 5)):  # noqa: B023
                us = median_us(fn, args.runs)
                out.append({"config": cname, "dir": name, "shape": [rows, d], "us": us, "gbps": arrays * n / us / 1e3})
                print(f"{cname:20s} {name} {rows}x{d}: {arrays * n / us / 1e3:6.0f} GB/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": out}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
