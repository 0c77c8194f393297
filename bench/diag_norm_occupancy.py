#!/usr/bin/env python3
"""How many register-row norm blocks an SM must hold (``__launch_bounds__``' min blocks, i.e. the
registers a thread may use, against spills), and how many 16-byte chunks of a row a thread
should hold (OPSMITH_ROW_CHUNKS: 4 halves the threads a row, so more rows fit an SM): norm.cu
compiled with each setting, its rms_norm and layer_norm kernels timed alone (CUDA events, median
of ``--runs``, L2 flushed between runs) with launch plans for those chunks, bf16, GB/s of the
bytes each kernel must move. The numbers chose the backwards' defaults in norm.cu; the forwards
measured here were a variant holding the row in T (bench/results/ops-peers-h100-2026-11-25/), since
replaced by the float-row forwards, which no longer read OPSMITH_ROW_FWD_BLOCKS.

    python3 bench/diag_norm_occupancy.py --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsmith._runtime import _driver
from opsmith._torch._cuda_module import CudaModule
from _kernel_timing import median_us  # noqa: E402  (bench/ is the script's folder)
from opsmith.ops import _launch, _launch_bwd, _sources

SHAPES = [(4096, 4096), (16384, 4096), (65536, 1024), (8192, 8192)]




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--blocks", action="store_true", help="the min-blocks sweep (chunks 2) instead of the chunks one")
    args = ap.parse_args()
    arch = _driver.device_arch(0)
    props = _launch.device_props(0)
    names = _sources.kernel_names("norm.cu", "bfloat16")
    rows_out = []
    configs = [(1, 1, 2), (2, 1, 2), (3, 1, 2), (2, 2, 2), (4, 1, 2)] if args.blocks else [(2, 2, 2), (1, 1, 4), (2, 1, 4)]
    for fb, bb, chunks in configs:  # rms and layer norm's backward alike here
        mod = CudaModule(_sources.KERNEL_DIR / "norm.cu", name_expressions=names, arch=arch,
                         defines={"OPSMITH_ROW_FWD_BLOCKS": fb, "OPSMITH_ROW_BWD_BLOCKS": bb, "OPSMITH_LN_BWD_BLOCKS": bb,
                                  "OPSMITH_ROW_CHUNKS": chunks}, name=f"norm-{fb}-{bb}-{chunks}")
        k = {n.split("<")[0]: mod.get_kernel(n) for n in names}
        for rows, cols in SHAPES:
            x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
            g, w, b = torch.randn_like(x), torch.randn(cols, dtype=x.dtype, device="cuda"), torch.randn(cols, dtype=x.dtype, device="cuda")
            y, dx = torch.empty_like(x), torch.empty_like(x)
            mean, rstd = (torch.empty(rows, device="cuda") for _ in range(2))
            fp = _launch.row_plan(rows, cols, 2, 1, props)
            bp = _launch_bwd.norm_bwd_plan(rows, cols, 2, props)
            if fp.strategy == "long" or bp.strategy == "long":
                continue
            if chunks != _launch.ROW_CHUNKS:  # the forward's plan for fatter threads; no backward
                tpr = 1 << max(0, (-(-cols // (chunks * 8)) - 1).bit_length())
                per_block = max(1, 128 // tpr) if tpr <= 32 else 1
                fp = _launch.Plan("warp" if tpr <= 32 else "block", (-(-rows // per_block),), (tpr, per_block), 0, 0)
            pw, pb = (torch.empty(bp.grid[0], cols, device="cuda") for _ in range(2))
            fc, bc = _launch.launch_config(fp), _launch.launch_config(bp)
            cases = {
                "rms_norm_fwd": (lambda: k["rms_norm_fwd"].launch(fc, x, w, y, rstd, rows, cols, 1e-6, 1), 2),
                "layer_norm_fwd": (lambda: k["layer_norm_fwd"].launch(fc, x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1), 2),
                "rms_norm_bwd": (lambda: k["rms_norm_bwd"].launch(bc, g, x, w, rstd, dx, pw, rows, cols, 1, 1, x, 0, x, 0),
                                 3),
                "layer_norm_bwd": (lambda: k["layer_norm_bwd"].launch(bc, g, x, w, mean, rstd, dx, pw, pb, rows, cols,
                                                                      1, 1, 1, x, x, 0), 3),
            }
            k["layer_norm_fwd"].launch(fc, x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1)  # mean/rstd for the bwd
            for name, (fn, arrays) in cases.items():
                if chunks != _launch.ROW_CHUNKS and "bwd" in name:
                    continue
                s = median_us(fn, args.runs) * 1e-6
                gbps = arrays * x.numel() * 2 / s / 1e9
                rows_out.append({"fwd_blocks": fb, "bwd_blocks": bb, "chunks": chunks, "kernel": name,
                                 "shape": [rows, cols], "gbps": gbps})
                print(f"fwd_blocks={fb} bwd_blocks={bb} chunks={chunks} {name:15s} {rows}x{cols}: {gbps:7.0f} GB/s",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
