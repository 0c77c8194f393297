r"""Issue 23: the gated forwards on large shapes. The H100 sweep of 2026-12-06 had gelu_and_mul (tanh) bf16
32768x8192 and 65536x8192 forward at 0.991x / 0.992x Liger-Kernel (±0.1 %), while silu_and_mul ran 1.000-1.003x on
the same shapes (bench/results/ops-h100-2026-12-06/). Times ``_functional.gated_fwd`` on a packed ``[rows, 2 d]``
input under each of ``--variants``:

- "shipped": as shipped (gated.cu's ``_one`` kernel: one 16-byte vector of one row a thread, 6 blocks an SM);
- "b8" / "b4": gated.cu compiled with ``OPSMITH_GATED_BLOCKS16`` 8 / 4 (the registers a thread may use);
- "r2" / "r4": gated.cu compiled with ``OPSMITH_GATED_ROWS16`` 2 / 4 (rows a thread loads a trip; the general
  kernel on gated_plan's grid for those rows; at 6 blocks an SM the forward of 4 spills, sm_90), "r4b4" 4 rows at
  4 blocks;
- "one" (``--dtype float32``): float's silu and tanh GELU on the kernel of one vector a thread, as the 16-bit types
  (float takes gated.cu's general kernel at ``GATED_ROWS`` rows a trip; the float32 sweep of 2026-12-06 had their
  forwards at 0.994-0.996x compile from 64 MiB);
- "split": ``_functional.gated_mul_fwd`` on gate and up as two tensors (as Liger is called);
- "liger": Liger-Kernel's ``liger_geglu`` / ``liger_swiglu`` on the two tensors;
- "copy": a device copy of the same bytes.

Each with ``opsmith.ops.benchmark`` (L2 flushed) in ``--rounds`` rounds, the variants in turn (the order rotating),
the figure the median of the rounds; every variant's output is checked against the shipped one first. Prints µs,
GB/s and each variant's ratio to "liger" (or to "shipped" without it); writes them to ``--json``.

    python3 bench/diag_gated_large.py --json gated-large.json
    python3 bench/diag_gated_large.py --acts gelu_tanh --shapes 32768x8192 --variants shipped,b8,r2,liger
    python3 bench/diag_gated_large.py --dtype float32 --variants shipped,one,split,liger,copy
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics

from _kernel_timing import kernel_from  # bench/, this script's folder
from bench_ops_peers import _copy  # its same-size copy

VARIANTS = "shipped,b8,b4,r2,r4,r4b4,one,split,liger,copy"
DEFINES = {"b8": {"OPSMITH_GATED_BLOCKS16": 8}, "b4": {"OPSMITH_GATED_BLOCKS16": 4},
           "r2": {"OPSMITH_GATED_ROWS16": 2}, "r4": {"OPSMITH_GATED_ROWS16": 4},
           "r4b4": {"OPSMITH_GATED_ROWS16": 4, "OPSMITH_GATED_BLOCKS16": 4}}


@contextlib.contextmanager
def _variant(name: str, modules: dict, dtype: str):
    """gated.cu's kernels and plans of variant ``name`` inside the block (a module compiled with DEFINES[name]; for
    "r2"/"r4", gated_shape's rows a trip too, so that the plan and the ``_one`` test follow the kernel; for "one",
    gated_shape's one row, one trip for float too)."""
    from opsmith.ops import _launch_gated, _sources
    if name not in DEFINES and name != "one":
        yield
        return
    saved = _sources.kernel, _launch_gated.gated_shape, _launch_gated.gated_plan
    mod = modules.get(name)
    rows16 = DEFINES.get(name, {}).get("OPSMITH_GATED_ROWS16")

    def shape(act, itemsize):
        got = saved[1](act, itemsize)
        if name == "one" and act != "gelu":
            return 1, 1, _launch_gated.GATED_BLOCKS16
        return (rows16, 1, got[2]) if rows16 and itemsize == 2 and act != "gelu" else got
    _sources.kernel = kernel_from(mod, "gated.cu", saved[0])
    _launch_gated.gated_shape = shape
    _launch_gated.gated_plan = saved[2].__wrapped__  # uncached: the plan follows the patched shape
    try:
        yield
    finally:
        _sources.kernel, _launch_gated.gated_shape, _launch_gated.gated_plan = saved


def main() -> None:
    import torch

    from opsmith import ops
    from opsmith._runtime import _driver
    from opsmith._torch._cuda_module import CudaModule
    from opsmith.ops import _functional, _sources

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--acts", default="gelu_tanh,silu")
    ap.add_argument("--shapes", default="32768x8192,65536x8192,16384x4096,8192x8192",
                    help="ROWSxD,...: the input is [ROWS, 2 D] of --dtype")
    ap.add_argument("--variants", default=VARIANTS, help=f"of {VARIANTS}")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    args = ap.parse_args()
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS.split(","))
    if unknown:
        raise SystemExit(f"diag_gated_large: unknown variants {sorted(unknown)}; pick from {VARIANTS}")
    liger = None
    if "liger" in variants:
        try:
            import liger_kernel.transformers.functional as liger
        except ImportError as exc:
            print(f"Liger-Kernel not importable ({exc}); its variant is left out", flush=True)
            variants.remove("liger")
    arch, dtype = _driver.device_arch(0), args.dtype
    dt = getattr(torch, dtype)
    names = _sources.kernel_names("gated.cu", dtype)
    modules = {v: CudaModule(_sources.KERNEL_DIR / "gated.cu", name_expressions=names, arch=arch, defines=DEFINES[v],
                             name=f"diag-gated-large-{v}") for v in variants if v in DEFINES}
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_gbps": ops.copy_bandwidth(),
           "cases": []}
    out["dtype"] = dtype
    print(f"{out['device']}, {dtype}, copy {out['copy_gbps']:.0f} GB/s", flush=True)
    for act in args.acts.split(","):
        liger_fn = None if liger is None else {"gelu_tanh": liger.liger_geglu, "silu": liger.liger_swiglu}[act]
        for shape in args.shapes.split(","):
            rows, d = (int(v) for v in shape.split("x"))
            torch.manual_seed(0)
            x = torch.randn(rows, 2 * d, dtype=dt, device="cuda")
            gate, up = x[:, :d].contiguous(), x[:, d:].contiguous()
            moved = 3 * rows * d * x.element_size()
            calls = {}
            for v in variants:
                if v == "copy":
                    calls[v] = _copy(moved, "cuda")[0]
                elif v == "liger":
                    calls[v] = lambda: liger_fn(gate, up)  # noqa: B023
                elif v == "split":
                    calls[v] = lambda: _functional.gated_mul_fwd(act, gate, up)  # noqa: B023
                else:
                    calls[v] = (lambda v=v: _run(v, modules, act, x, dtype))  # noqa: B023
            with torch.no_grad():
                ref = _functional.gated_fwd(act, x)
                for v in variants:
                    if v != "copy":
                        got = calls[v]()
                        err = (got.float() - ref.float()).abs().max().item()
                        if err > 0.02 * max(1.0, ref.float().abs().max().item()):
                            raise SystemExit(f"diag_gated_large: {v} {act} {shape} differs from shipped by {err}")
                per = {v: [] for v in variants}
                for r in range(args.rounds):
                    for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                        per[v].append(ops.benchmark(calls[v], bytes_moved=moved, runs=args.runs, warmup=3).median_ms)
            us = {v: statistics.median(ms) * 1e3 for v, ms in per.items()}
            base = "liger" if "liger" in us else "shipped"
            case = {"act": act, "rows": rows, "d": d, "us": us, "rounds_ms": per,
                    "gbps": {v: moved / (t * 1e-6) / 1e9 for v, t in us.items()}}
            out["cases"].append(case)
            cells = [f"{v} {t:8.2f} us {case['gbps'][v]:5.0f} GB/s ({us[base] / t:.3f}x)" for v, t in us.items()]
            print(f"{act:9s} {rows:6d}x{d:<6d} " + " | ".join(cells), flush=True)
            del x, gate, up, calls
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


def _run(v: str, modules: dict, act: str, x, dtype: str):
    from opsmith.ops import _functional
    with _variant(v, modules, dtype):
        return _functional.gated_fwd(act, x)


if __name__ == "__main__":
    main()
