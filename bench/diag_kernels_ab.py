#!/usr/bin/env python3
"""The opsmith.ops row kernels of this tree against the same kernels from another folder of sources (a copy
of opsmith/ops/kernels/ at another commit: ``git archive REV opsmith/ops/kernels | tar -x -C DIR``), under
the plans of this tree: softmax, layer_norm and rms_norm forward and backward (``--ops rows``), or
silu_and_mul and the tanh gelu_and_mul (``--ops gated``, beside Liger-Kernel's swiglu and geglu kernels
where it imports), through opsmith.ops' Python implementations, kernels alone (torch.profiler, us a
call, L2 warm), GB/s of the bytes-moved floor, "before" and "now" measured alternately in one process,
each result checked against the other's. Needs a GPU.

    python3 bench/diag_kernels_ab.py [--before DIR] [--ops rows|gated] [--out FILE.json] [--repeat 2]
                                     [--cases layer_norm_fwd,...] [--shapes bfloat16:4096x4096,...]
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402  (bench/, this script's folder)
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _norms, _sources  # noqa: E402

SHAPES = [(torch.bfloat16, r, c) for r, c in ((65536, 256), (65536, 1024), (16384, 2048), (4096, 4096),
                                               (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768))]
SHAPES += [(torch.float32, r, c) for r, c in ((16384, 1024), (8192, 4096))]
# gated: rows x d outputs of a packed [rows, 2d] input (the peers benchmark's shapes and the Llama MLP's)
GATED_SHAPES = [(torch.bfloat16, r, c) for r, c in ((2048, 2048), (4096, 4096), (65536, 1024), (4096, 5632),
                                                      (8192, 8192))]


def row_cases(dt, rows, cols):
    """{case: (arrays of the floor, f)} for the row ops."""
    x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
    w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
    g = torch.randn_like(x)
    y = fn.softmax_cuda(x, -1)
    _, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)
    _, rrstd = _norms.rms_norm_fwd(x, [cols], w, 1e-6)
    return x.numel() * x.element_size() / 1e3, {
        "softmax fwd": (2, lambda: fn.softmax_cuda(x, -1)),
        "softmax bwd": (3, lambda: fn.softmax_backward_cuda(g, y, -1)),
        "layer_norm fwd": (2, lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0]),
        "layer_norm bwd": (3, lambda: _norms.layer_norm_bwd(g, x, [cols], mean, rstd, True, True, w)[0]),
        "rms_norm fwd": (2, lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0]),
        "rms_norm bwd": (3, lambda: _norms.rms_norm_bwd(g, x, [cols], rrstd, True, w)[0]),
    }


def gated_cases(dt, rows, d):
    """{case: (arrays of the floor in units of rows x d, f)} for the gated ops (packed input)."""
    x = torch.randn(rows, 2 * d, device="cuda", dtype=dt) * 2
    g = torch.randn(rows, d, device="cuda", dtype=dt)
    return rows * d * x.element_size() / 1e3, {
        "silu_and_mul fwd": (3, lambda: fn.gated_fwd("silu", x)),
        "silu_and_mul bwd": (5, lambda: fn.gated_bwd("silu", g, x)),
        "gelu_tanh fwd": (3, lambda: fn.gated_fwd("gelu_tanh", x)),
        "gelu_tanh bwd": (5, lambda: fn.gated_bwd("gelu_tanh", g, x)),
    }


def liger_gated(dt, rows, d):
    """{case: f} of Liger-Kernel's swiglu / geglu kernels on separate gate and up tensors (its backward
    writes its gradients over them: the values drift from call to call, the work does not)."""
    try:
        from liger_kernel.ops.geglu import geglu_backward, geglu_forward
        from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward
    except ImportError:
        return {}
    a, b = (torch.randn(rows, d, device="cuda", dtype=dt) * 2 for _ in range(2))
    g = torch.randn(rows, d, device="cuda", dtype=dt)
    return {"silu_and_mul fwd": lambda: swiglu_forward(a, b), "silu_and_mul bwd": lambda: swiglu_backward(a, b, g),
            "gelu_tanh fwd": lambda: geglu_forward(a, b), "gelu_tanh bwd": lambda: geglu_backward(a, b, g)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="the other tree's kernels folder (none: this tree alone, and Liger for gated)")
    ap.add_argument("--out")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ops", choices=("rows", "gated"), default="rows")
    ap.add_argument("--cases", help="comma-separated case names, _ for spaces (default: all of --ops)")
    ap.add_argument("--shapes", help="comma-separated DTYPE:ROWSxCOLS (default: the --ops list)")
    args = ap.parse_args()
    shapes = SHAPES if args.ops == "rows" else GATED_SHAPES
    if args.shapes:
        shapes = [(getattr(torch, d), *map(int, rc.split("x")))
                  for d, rc in (s.split(":") for s in args.shapes.split(","))]
    only = set(args.cases.split(",")) if args.cases else None
    before_dir = Path(args.before) if args.before else None
    whiches = ("before", "now") if before_dir else ("now",)
    now_kernel = _sources.kernel
    mods: dict = {}

    def before_kernel(file, name, dtype, device):
        key = (file, dtype, device)
        if key not in mods:
            mods[key] = CudaModule(before_dir / file, name_expressions=_sources.kernel_names(file, dtype),
                                   arch=_driver.device_arch(device), name=f"before/{file}")
        t, a = _sources.DTYPES[dtype]
        return mods[key].get_kernel(name.format(T=t, A=a))

    def run(which, f):
        _sources.kernel = before_kernel if which == "before" else now_kernel
        try:
            return f()
        finally:
            _sources.kernel = now_kernel

    records = []
    for dt, rows, cols in shapes:
        nbytes, cases = (row_cases if args.ops == "rows" else gated_cases)(dt, rows, cols)
        peer = liger_gated(dt, rows, cols) if args.ops == "gated" else {}
        for case, (arrays, f) in cases.items():
            if only is not None and case.replace(" ", "_") not in only:
                continue
            got = {w_: run(w_, f) for w_ in whiches}
            if before_dir:
                torch.testing.assert_close(got["now"], got["before"], rtol=2e-2, atol=2e-2)
            us = {w_: [] for w_ in whiches}
            for _ in range(args.repeat):
                for which in whiches:
                    us[which].append(run(which, lambda: sum(per_kernel(f).values())))
            if case in peer:
                us["liger"] = [sum(per_kernel(peer[case]).values()) for _ in range(args.repeat)]
            gbs = {k: arrays * nbytes / min(v) for k, v in us.items()}
            rec = {"case": case, "dtype": str(dt)[6:], "rows": rows, "cols": cols, "us": us, "gbps": gbs}
            records.append(rec)
            print(f"{case:<15} {rec['dtype']:<8} {rows:>6}x{cols:<6} GB/s"
                  + (f" before {gbs['before']:5.0f}" if before_dir else "")
                  + f" now {gbs['now']:5.0f}" + (f" ({gbs['now'] / gbs['before']:5.3f}x)" if before_dir else "")
                  + (f" liger {gbs['liger']:5.0f} (now {gbs['now'] / gbs['liger']:5.3f}x)" if "liger" in gbs else ""),
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f,
                      indent=1)


if __name__ == "__main__":
    main()
