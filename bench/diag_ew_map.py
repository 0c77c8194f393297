#!/usr/bin/env python3
"""Which index map and unroll make the elementwise kernels fastest, beside torch eager? (a diagnostic)

bench/diag_ew_map.cu holds the shipped loop (MAP 0: a thread's U vectors a grid apart, one trip a thread)
and a block-contiguous map (MAP 1: a block's U * threads vectors one span, a thread's vectors a block
apart). Times relu, the erf GELU and silu, forward and backward, fp32 and bf16, from 2 to 512 MiB moved
(forward), with :func:`opsmith.ops.benchmark` (L2 flushed, host latency hidden), beside the shipped ops and
torch eager's aten kernels; each variant's output is checked against the shipped kernel's.

    python3 bench/diag_ew_map.py [--json OUT.json] [--sizes 2,32,512] [--ops relu,silu] [--dirs fwd]
                                 [--variants 0:4:256,1:1:256]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opsmith.ops as ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _functional, _launch, _sources  # noqa: E402

VARIANTS = [(0, 4, 256), (1, 1, 256), (1, 2, 128), (2, 1, 256), (2, 2, 256), (2, 2, 128), (2, 4, 256), (2, 4, 128),
            (2, 1, 128), (2, 1, 512)]
OPS = ("relu", "gelu_erf", "gelu_erfx", "gelu_tanh", "silu")
EAGER_FWD = {"relu": torch.relu, "gelu_erf": torch.nn.functional.gelu, "gelu_erfx": torch.nn.functional.gelu,
             "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"), "silu": torch.nn.functional.silu}
EAGER_BWD = {"relu": lambda g, x: torch.ops.aten.threshold_backward(g, x, 0),
             "gelu_erf": lambda g, x: torch.ops.aten.gelu_backward(g, x),
             "gelu_erfx": lambda g, x: torch.ops.aten.gelu_backward(g, x),
             "gelu_tanh": lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh"),
             "silu": lambda g, x: torch.ops.aten.silu_backward(g, x)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--sizes", default="2,8,32,128,512")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dirs", default="fwd,bwd")
    ap.add_argument("--variants", help="MAP:U:THREADS,... (default: all of VARIANTS)")
    args = ap.parse_args()
    ops_, dirs = args.ops.split(","), args.dirs.split(",")
    variants = [tuple(int(v) for v in x.split(":")) for x in args.variants.split(",")] if args.variants else VARIANTS
    arch = _driver.device_arch(0)
    copy = ops.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s", flush=True)
    records = []
    for dtype in (torch.float32, torch.bfloat16):
        t, _ = _sources.DTYPES[str(dtype)[6:]]
        names = [f"{op}_{d}_map<{t}, {u}, {m}>" for op in ops_ for d in dirs for m, u, _ in variants]
        mod = CudaModule(Path(__file__).with_name("diag_ew_map.cu"), name_expressions=sorted(set(names)), arch=arch,
                         include_paths=[_sources.KERNEL_DIR], name="diag-ew-map")
        for mib in (int(s) for s in args.sizes.split(",")):
            n = (mib << 20) // 2 // dtype.itemsize
            x = torch.randn(n, device="cuda", dtype=dtype)
            g = torch.randn_like(x)
            vec = 16 // dtype.itemsize
            for op in ops_:
                for d in dirs:
                    arrs = (x,) if d == "fwd" else (g, x)
                    moved = (len(arrs) + 1) * x.nbytes
                    sop = op.replace("erfx", "erf")
                    ref = _functional.ew_fwd(sop, x) if d == "fwd" else _functional.ew_bwd(sop, g, x)
                    plan = _launch.elementwise_plan(n, dtype.itemsize, _launch.device_props(0))
                    ks = _sources.kernel("elementwise.cu", f"{sop}_{d}<{{T}}>", str(dtype)[6:], 0)
                    ys = torch.empty_like(x)
                    impls = {"shipped": (lambda: _functional.ew_fwd(sop, x)) if d == "fwd"
                             else (lambda: _functional.ew_bwd(sop, g, x)),
                             "raw": lambda ks=ks, arrs=arrs: ks.launch(_launch.launch_config(plan), *arrs, ys, n),
                             "eager": (lambda: EAGER_FWD[op](x)) if d == "fwd" else (lambda: EAGER_BWD[op](g, x))}
                    for m, u, th in variants:
                        k = mod.get_kernel(f"{op}_{d}_map<{t}, {u}, {m}>")
                        grid = max(1, -(-(n // vec) // (th * u)))
                        cfg = _launch.launch_config(_launch.Plan("elementwise", (grid,), (th,), 0, 0))
                        y = torch.empty_like(x)

                        def launch(k=k, cfg=cfg, y=y, arrs=arrs):
                            k.launch(cfg, *arrs, y, n)
                            return y
                        launch()
                        if op == sop:
                            torch.testing.assert_close(y, ref, rtol=0, atol=0)
                        else:
                            torch.testing.assert_close(y, ref)
                        impls[f"m{m}u{u}t{th}"] = launch
                    res = {name: ops.benchmark(f, bytes_moved=moved, runs=args.runs) for name, f in impls.items()}
                    us = {name: r.median_ms * 1e3 for name, r in res.items()}
                    rec = {"op": op, "dir": d, "dtype": str(dtype)[6:], "mib": mib, "us": us,
                           "fraction": {name: r.fraction for name, r in res.items()}}
                    records.append(rec)
                    best = min((v, k) for k, v in us.items() if k not in ("eager",))
                    print(f"{op:8s} {d} {rec['dtype']:8s} {mib:4d} MiB eager {us['eager']:8.2f} us  "
                          + "  ".join(f"{k} {us['eager'] / v:5.3f}" for k, v in us.items() if k != "eager")
                          + f"  (best {best[1]})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy,
                                               "torch": torch.__version__, "records": records}, indent=1))


if __name__ == "__main__":
    main()
