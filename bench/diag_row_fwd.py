#!/usr/bin/env python3
"""How many register-row forward blocks an SM must hold (``OPSMITH_ROW_FWD_BLOCKS``: the registers
a thread may use, against spills) and how many 16-byte chunks a thread holds (``OPSMITH_ROW_CHUNKS``):
norm.cu, fused_norm.cu and softmax.cu compiled with each setting, their register-row forward
kernels (and softmax's backward) timed alone with the launch plan for those chunks (CUDA events,
median, L2 flushed), GB/s of the bytes each must move.

    python3 bench/diag_row_fwd.py --json OUT.json

bench/results/ops-bwd-h200-2026-11-26/fwd.json was measured with a temporary
``OPSMITH_ROW_FWD_BLOCKS`` define on every register-row kernel here (the working tree before
72e7ae5). The kernels now fix their minimum blocks per kernel and element size
(``RowBlocks<T, ...>`` in common.cuh, from that run), so that define no longer exists and only
``OPSMITH_ROW_CHUNKS`` varies between these configs.
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

SHAPES = [(4096, 2048), (4096, 4096), (16384, 4096), (65536, 1024), (8192, 8192), (32768, 8192)]
CONFIGS = {"b1 c2 (shipped)": (1, 2), "b2 c2": (2, 2), "b3 c2": (3, 2), "b4 c2": (4, 2), "b2 c1": (2, 1),
           "b4 c1": (4, 1)}




def plan(rows: int, cols: int, itemsize: int, chunks: int, props) -> _launch.Plan | None:
    """row_plan's register strategies for ``chunks`` chunks a thread (None: the long strategy)."""
    vec = 16 // itemsize
    tpr = 1 << max(0, (-(-cols // (chunks * vec)) - 1).bit_length())
    if tpr > _launch.ROW_THREADS:
        return None
    if tpr <= 32:
        per_block = max(1, 128 // tpr)
        while per_block > 1 and per_block * tpr > 32 and -(-rows // per_block) < 2 * props.sm_count:
            per_block //= 2
        return _launch.Plan("warp", (-(-rows // per_block),), (tpr, per_block), 0, 0)
    return _launch.Plan("block", (rows,), (tpr, 1), 0, 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    arch = _driver.device_arch(0)
    props = _launch.device_props(0)
    out = []
    for dtype in args.dtypes.split(","):
        tdt = getattr(torch, dtype)
        for cname, (blocks, chunks) in CONFIGS.items():
            defines = {"OPSMITH_ROW_FWD_BLOCKS": blocks, "OPSMITH_ROW_CHUNKS": chunks}
            k = {}
            for f in ("norm.cu", "fused_norm.cu", "softmax.cu"):
                names = _sources.kernel_names(f, dtype)
                mod = CudaModule(_sources.KERNEL_DIR / f, name_expressions=names, arch=arch, defines=defines,
                                 name=f"diag-fwd-{f}-{blocks}-{chunks}")
                k.update({n.split("<")[0]: mod.get_kernel(n) for n in names})
            for rows, cols in SHAPES:
                x = torch.randn(rows, cols, dtype=tdt, device="cuda")
                r, w = torch.randn_like(x), torch.randn(cols, dtype=tdt, device="cuda")
                y, s = torch.empty_like(x), torch.empty_like(x)
                mean, rstd = (torch.empty(rows, device="cuda", dtype=torch.float32) for _ in range(2))
                p = plan(rows, cols, x.element_size(), chunks, props)
                if p is None:
                    continue
                cfg = _launch.launch_config(p)
                cases = {
                    "rms_norm_fwd": (lambda: k["rms_norm_fwd"].launch(cfg, x, w, y, rstd, rows, cols, 1e-6, 1), 2),
                    "layer_norm_fwd": (lambda: k["layer_norm_fwd"].launch(cfg, x, w, w, y, mean, rstd, rows, cols,
                                                                          1e-5, 1, 1), 2),
                    "add_rms_norm_fwd": (lambda: k["add_rms_norm_fwd"].launch(cfg, x, r, w, y, s, rstd, rows, cols,
                                                                              1e-6, 1), 4),
                    "softmax_fwd": (lambda: k["softmax_fwd"].launch(cfg, x, y, rows, cols), 2),
                    "softmax_bwd": (lambda: k["softmax_bwd"].launch(cfg, r, x, y, rows, cols), 3),
                }
                for name, (fn, arrays) in cases.items():
                    us = median_us(fn, args.runs)
                    gbps = arrays * x.numel() * x.element_size() / us / 1e3
                    out.append({"dtype": dtype, "config": cname, "kernel": name, "shape": [rows, cols], "us": us,
                                "gbps": gbps})
                    print(f"{dtype:9s} {cname:16s} {name:17s} {rows}x{cols}: {gbps:6.0f} GB/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": out},
                                        separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
