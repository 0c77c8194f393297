#!/usr/bin/env python3
"""Do the register-row forwards gain from keeping their loads in flight through the reductions?
bench/diag_pipe.cu's persistent kernels copy the next trips' rows into shared memory with cp.async
(``PIPE_STAGES`` stages, ``PIPE_BLOCKS`` the minimum blocks an SM holds, ``PIPE_CS`` streaming
stores) and are timed beside the shipped softmax_fwd, rms_norm_fwd and layer_norm_fwd (their
launch plan; add_rms_norm_fwd too), those of another commit's kernels folder (``--baseline``) and
Liger-Kernel's forwards where it is installed (CUDA events, median, L2 flushed),
GB/s of the bytes each must move. Each pipelined output is checked against the shipped kernel's.

    python3 bench/diag_pipe.py --json OUT.json
    python3 bench/diag_pipe.py --no-pipe --baseline OLD/opsmith/ops/kernels --json OUT.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from _kernel_timing import median_us  # noqa: E402  (bench/ is the script's folder)
from opsmith.ops import _launch, _launch_norm, _sources  # noqa: E402

SHAPES = [(4096, 2048), (4096, 4096), (16384, 4096), (65536, 1024), (8192, 8192), (32768, 8192), (262144, 256),
          (16384, 5120), (8192, 3001)]
KERNELS = ("softmax_fwd", "rms_norm_fwd", "layer_norm_fwd")


def shipped(arch: str, dtype: str, kernel_dir: Path = _sources.KERNEL_DIR) -> dict:
    k = {}
    for f in ("norm.cu", "softmax.cu", "fused_norm.cu"):
        text = (kernel_dir / f).read_text()
        names = [n for n in _sources.kernel_names(f, dtype) if f"\n{n.split('<')[0]}(" in text]  # another commit's
        mod = CudaModule(kernel_dir / f, name_expressions=names, arch=arch, name=f"diag-pipe-{kernel_dir.name}-{f}")
        k.update({n.split("<")[0]: mod.get_kernel(n) for n in names})
    return k


def piped(arch: str, dtype: str, stages: int, blocks: int, cs: int) -> dict:
    t, a = _sources.DTYPES[dtype]
    names = [f"softmax_fwd_pipe<{t}>", f"rms_norm_fwd_pipe<{t}, {a}>", f"layer_norm_fwd_pipe<{t}, {a}>"]
    mod = CudaModule(Path(__file__).with_name("diag_pipe.cu"), name_expressions=names, arch=arch,
                     include_paths=[_sources.KERNEL_DIR], name=f"diag-pipe-{stages}-{blocks}-{cs}",
                     defines={"PIPE_STAGES": stages, "PIPE_BLOCKS": blocks, "PIPE_CS": cs})
    return {n.split("<")[0].replace("_pipe", ""): mod.get_kernel(n) for n in names}


def liger_fns():
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:
        return None
    return {"softmax_fwd": lambda x, w, b: lf.liger_softmax(x),
            "rms_norm_fwd": lambda x, w, b: lf.liger_rms_norm(x, w, 1e-6),
            "layer_norm_fwd": lambda x, w, b: lf.liger_layer_norm(x, w, b, 1e-5)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--blocks", default="2,3,4")
    ap.add_argument("--cs", default="0,1")
    ap.add_argument("--no-pipe", action="store_true", help="time the shipped kernels (and --baseline) only")
    ap.add_argument("--baseline", type=Path, action="append", default=[], help="a kernels folder (another commit's opsmith/ops/kernels) to "
                    "time beside the shipped one, with the same launch plans; repeatable")
    args = ap.parse_args()
    arch = _driver.device_arch(0)
    props = _launch.device_props(0)
    liger = liger_fns()
    out = []
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    configs = list(itertools.product(ints(args.stages), ints(args.blocks), ints(args.cs)))
    for dtype in args.dtypes.split(","):
        tdt = getattr(torch, dtype)
        builds = {"shipped": shipped(arch, dtype)}
        for i, d in enumerate(args.baseline):
            builds["baseline" if i == 0 else f"baseline:{d.name}"] = shipped(arch, dtype, d)
        for s, b, cs in ([] if args.no_pipe else configs):
            builds[f"pipe s{s} b{b} cs{cs}"] = piped(arch, dtype, s, b, cs)
        for rows, cols in SHAPES:
            x = torch.randn(rows, cols, dtype=tdt, device="cuda")
            w, bias = torch.randn(cols, dtype=tdt, device="cuda"), torch.randn(cols, dtype=tdt, device="cuda")
            y, res, s_out = torch.empty_like(x), torch.randn_like(x), torch.empty_like(x)
            mean, rstd = (torch.empty(rows, device="cuda", dtype=torch.float32) for _ in range(2))
            p = _launch.row_plan(rows, cols, x.element_size(), 1, props)
            if p.strategy == "long":
                continue
            nbytes = 2 * x.numel() * x.element_size()
            # the launchers' choice of layer_norm's kernel where the build has it (a pipe build: its own)
            vec = cols % (16 // x.element_size()) == 0  # the tensors here are aligned
            wide = _launch_norm.layer_norm_kernel(p, vec) if hasattr(_launch_norm, "layer_norm_kernel") else "layer_norm_fwd"
            refs = {}
            for bname, k in builds.items():
                if bname == "shipped" or bname.startswith("baseline"):
                    cfg = _launch.launch_config(p)
                    occ = None
                else:
                    tpr, per = p.block
                    stages = int(bname.split()[1][1:])
                ln_name = wide if wide in k else "layer_norm_fwd"
                for kname in KERNELS + (("add_rms_norm_fwd",) if "pipe" not in bname else ()):
                    if "pipe" in bname:
                        params = {"softmax_fwd": 0, "rms_norm_fwd": 1, "layer_norm_fwd": 2}[kname]
                        smem = (stages * per + params) * _launch.ROW_CHUNKS * tpr * 16
                        st = k[kname]._state(0)
                        st.opt_in_shared()
                        fn = st.fn
                        occ = _driver.occupancy_active_blocks(fn, tpr * per, smem)
                        grid = max(1, min(occ * props.sm_count, -(-rows // per)))
                        cfg = _launch.launch_config(_launch.Plan("pipe", (grid,), p.block, smem, 0))
                    launch = {
                        "softmax_fwd": lambda: k["softmax_fwd"].launch(cfg, x, y, rows, cols),
                        "rms_norm_fwd": lambda: k["rms_norm_fwd"].launch(cfg, x, w, y, rstd, rows, cols, 1e-6, 1),
                        "layer_norm_fwd": lambda: k[ln_name].launch(cfg, x, w, bias, y, mean, rstd, rows, cols, 1e-5,
                                                                    1, 1),
                        "add_rms_norm_fwd": lambda: k["add_rms_norm_fwd"].launch(cfg, x, res, w, y, s_out, rstd, rows,
                                                                                 cols, 1e-6, 1),
                    }[kname]
                    y.fill_(float("nan"))
                    launch()
                    torch.cuda.synchronize()
                    if bname == "shipped":
                        refs[kname] = y.clone()
                        err = 0.0
                    else:
                        err = (y.float() - refs[kname].float()).abs().max().item()
                    us = median_us(launch, args.runs)
                    gbps = nbytes * (2 if kname == "add_rms_norm_fwd" else 1) / us / 1e3
                    out.append({"dtype": dtype, "build": bname, "kernel": kname, "shape": [rows, cols], "us": us,
                                "gbps": gbps, "occupancy": occ, "max_err_vs_shipped": err})
                    print(f"{dtype:9s} {bname:18s} {kname:15s} {rows}x{cols}: {gbps:6.0f} GB/s occ {occ} "
                          f"err {err:.2g}", flush=True)
            if liger is not None:
                for kname in KERNELS:
                    fn = liger[kname]
                    us = median_us(lambda: fn(x, w, bias), args.runs)  # noqa: B023
                    out.append({"dtype": dtype, "build": "liger", "kernel": kname, "shape": [rows, cols], "us": us,
                                "gbps": nbytes / us / 1e3})
                    print(f"{dtype:9s} {'liger':18s} {kname:15s} {rows}x{cols}: {nbytes / us / 1e3:6.0f} GB/s",
                          flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": out},
                                        separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
