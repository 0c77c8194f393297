#!/usr/bin/env python3
"""The order a backward takes its rows in. A forward followed by its backward (bench_ops_peers.py's "fwd+bwd", a
recomputed activation) finds the forward's last rows still in L2; a backward that walks its rows last first
(common.cuh's bwd_row; OPSMITH_BWD_REVERSE=1, the default) reads them before its own traffic evicts them.
Liger-Kernel's gated backward, which writes over its inputs, gains some of the same.

For softmax, silu_and_mul and gelu_and_mul's tanh form, layer_norm, rms_norm and add_rms_norm (bf16; the norms'
register-row and split backwards: norm.cu, norm_split.cu), through opsmith.ops' Python implementations (_functional;
the C++ ops run the same plans and kernels) with their kernel files compiled with OPSMITH_BWD_REVERSE=0 ("forward":
first row first, as before) and 1 ("reversed"): the forward and backward kernels together after an L2 flush
("pair"), the backward alone after a flush ("bwd": the order should not matter there), and Liger's autograd forward
+ backward, GB/s of the bytes-moved floor (opsmith.ops.benchmark, median of 100). Each reversed result is checked
against the forward order's. Needs a GPU; Liger is optional (PYTHONPATH to its wheel's files).

    python3 bench/diag_bwd_order.py [--json FILE] [--ops softmax,layer_norm,...]
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _fused, _norms, _sources  # noqa: E402

try:
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.geglu import LigerGELUMulFunction
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.softmax import LigerSoftmaxFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    LIGER_GATED = {"silu_and_mul": LigerSiLUMulFunction, "gelu_and_mul": LigerGELUMulFunction}
except ImportError:
    LigerSoftmaxFunction, LIGER_GATED = None, {}

SOFTMAX = [(2048, 2048), (4096, 4096), (16384, 4096), (65536, 1024), (4096, 16384), (2048, 32768), (8192, 8192)]
GATED = [(2048, 2048), (4096, 4096), (16384, 4096), (8192, 8192)]  # rows x d (the input packed [rows, 2 d])
NORMS = [(2048, 2048), (4096, 4096), (16384, 4096), (65536, 1024), (8192, 8192)]
FILES = {"softmax": ("softmax.cu",), "gated": ("gated.cu",), "norm": ("norm.cu", "norm_split.cu")}


def _compiled(file, dtype, reverse):
    return CudaModule(_sources.KERNEL_DIR / file, name_expressions=_sources.kernel_names(file, dtype),
                      arch=_driver.device_arch(0), defines={"OPSMITH_BWD_REVERSE": reverse},
                      name=f"diag/{file}:reverse={reverse}")


def _cases():
    for rows, cols in SOFTMAX:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        g = torch.randn_like(x)
        n = x.nbytes
        xl = x.detach().clone().requires_grad_()
        liger = LigerSoftmaxFunction and (lambda xl=xl, g=g: torch.autograd.grad(LigerSoftmaxFunction.apply(xl), xl, g))
        yield ("softmax", rows, cols, "softmax", lambda x=x: fn.softmax_fwd(x),
               lambda y, g=g: fn.softmax_bwd(g, y), 2 * n, 5 * n, x, liger)
    for name, act in (("silu_and_mul", "silu"), ("gelu_and_mul", "gelu_tanh")):
        for rows, d in GATED:
            x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16)
            g = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
            n = g.nbytes
            liger, f = None, LIGER_GATED.get(name)
            if f is not None:
                a, b = (x[:, :d].contiguous().requires_grad_(), x[:, d:].contiguous().requires_grad_())
                liger = (lambda f=f, a=a, b=b, g=g: torch.autograd.grad(f.apply(a, b), (a, b), g))
            yield (name, rows, d, "gated", lambda x=x, act=act: fn.gated_fwd(act, x),
                   lambda y, x=x, g=g, act=act: fn.gated_bwd(act, g, x), 3 * n, 8 * n, x, liger)
    yield from _norm_cases()


def _norm_cases():
    """layer_norm, rms_norm and add_rms_norm (its backward: rms_norm's on the new residual, plus the gradient
    that reached it), weights and bias of the row's width."""
    for rows, cols in NORMS:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        res, g = torch.randn_like(x), torch.randn_like(x)
        w, b = torch.randn(cols, device="cuda", dtype=x.dtype), torch.randn(cols, device="cuda", dtype=x.dtype)
        n = x.nbytes
        ln = lambda x=x, w=w, b=b, c=cols: _norms.layer_norm_fwd(x, [c], w, b, 1e-5)  # noqa: E731
        ln_b = lambda y, x=x, w=w, g=g, c=cols: _norms.layer_norm_bwd(g, x, [c], y[1], y[2], True, True, w)[0]  # noqa
        rms = lambda x=x, w=w, c=cols: _norms.rms_norm_fwd(x, [c], w, 1e-6)  # noqa: E731
        rms_b = lambda y, x=x, w=w, g=g, c=cols: _norms.rms_norm_bwd(g, x, [c], y[1], True, w)[0]  # noqa: E731
        add = lambda x=x, r=res, w=w, c=cols: _fused.add_rms_norm_cuda(x, r, [c], w, 1e-6)  # noqa: E731
        add_b = lambda y, w=w, g=g, c=cols: _norms.rms_norm_bwd(g, y[1], [c], y[2], True, w, g)[0]  # noqa: E731
        liger = {}
        if LigerSoftmaxFunction is not None:
            # (Liger's own copies: its rms_norm backward writes its input gradient over the upstream one)
            xl, rl, wl, bl, gl = (t.detach().clone().requires_grad_(t is not g) for t in (x, res, w, b, g))
            liger = {"layer_norm": lambda: torch.autograd.grad(LigerLayerNormFunction.apply(xl, wl, bl, 1e-5),
                                                               (xl, wl, bl), gl),
                     "rms_norm": lambda: torch.autograd.grad(LigerRMSNormFunction.apply(xl, wl, 1e-6), (xl, wl), gl),
                     "add_rms_norm": lambda: torch.autograd.grad(
                         LigerFusedAddRMSNormFunction.apply(xl, rl, wl, 1e-6), (xl, rl, wl), (gl, gl))}
        # bytes: fwd x (and the residual) read, y (and s) written; bwd g and x (s; and g again) read, dx written
        yield ("layer_norm", rows, cols, "norm", ln, ln_b, 2 * n, 5 * n, x, liger.get("layer_norm"))
        yield ("rms_norm", rows, cols, "norm", rms, rms_b, 2 * n, 5 * n, x, liger.get("rms_norm"))
        yield ("add_rms_norm", rows, cols, "norm", add, add_b, 4 * n, 8 * n, x, liger.get("add_rms_norm"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--ops", help="a comma-separated subset of the ops (default: all)")
    args = ap.parse_args()
    records = []
    mods = {}
    for op, rows, cols, file, fwd, bwd, fwd_bytes, pair_bytes, x, liger in _cases():
        if args.ops and op not in args.ops.split(","):
            continue
        with torch.no_grad():
            y0 = fwd()
        keys = [(f, "bfloat16", 0) for f in FILES[file]]
        for key in keys:
            if key not in mods:
                mods[key] = {"shipped": _sources._modules[key], "forward": _compiled(key[0], "bfloat16", 0),
                             "reversed": _compiled(key[0], "bfloat16", 1)}
        rec = {"op": op, "rows": rows, "cols": cols}
        with torch.no_grad():
            for label in ("forward", "reversed"):
                for key in keys:
                    _sources._modules[key] = mods[key][label]
                if label == "forward":
                    dx0 = bwd(y0).clone()
                torch.testing.assert_close(bwd(y0), dx0, rtol=0, atol=0)
                rec[f"pair_{label}"] = ops.benchmark(lambda: bwd(fwd()), bytes_moved=pair_bytes).gbps
                rec[f"bwd_{label}"] = ops.benchmark(lambda: bwd(y0), bytes_moved=pair_bytes - fwd_bytes).gbps
            for key in keys:
                _sources._modules[key] = mods[key]["shipped"]
        if liger is not None:
            rec["pair_liger"] = ops.benchmark(liger, bytes_moved=pair_bytes).gbps
        records.append(rec)
        print(f"{op:<13} {rows:>5}x{cols:<5} fwd+bwd GB/s forward {rec['pair_forward']:5.0f} reversed "
              f"{rec['pair_reversed']:5.0f} ({rec['pair_reversed'] / rec['pair_forward']:.3f}x) liger "
              f"{rec.get('pair_liger', 0):5.0f} | bwd alone {rec['bwd_forward']:5.0f} -> {rec['bwd_reversed']:5.0f}",
              flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
