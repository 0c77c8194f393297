r"""Issue 23: the norm forwards' chunks a thread. The peers sweep of 2026-12-06 on the H100 had rms_norm bf16
2048x2048 at 0.912x torch.compile (bench/results/ops-h100-2026-12-06/). Times the Python implementations
(:mod:`opsmith.ops._norms`) under each of ``--variants``: "shipped" (16-bit rows of 2-16 KiB at 4 chunks a thread,
``norm_c4_plan``; layer_norm's 2-4 KiB rows at 2, ``layer_norm_full2_plan``), "two_chunks" (both plans declined: the
register rows of ``norm_fwd_plan``), "four_chunks" (float rms_norm's rows at layer_norm's 4-chunk plan, where it
keeps 2 as shipped) and "compile" (``torch.compile(dynamic=False)`` of the torch function), each with
``opsmith.ops.benchmark`` (L2 flushed) in ``--rounds`` rounds in turn, every variant's output checked against float64
first; prints µs and each variant's ratio to compile, writes µs and GB/s to ``--json``.

    python3 bench/diag_small_rows.py --json small-rows.json
    python3 bench/diag_small_rows.py --dtype float32 --ops rms_norm --variants shipped,four_chunks,compile \
        --shapes 16384x1536,16384x2560,16384x3072,8192x3584
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics


@contextlib.contextmanager
def _variant(launch_norm, name: str):
    """The plans of variant ``name`` inside the block: "two_chunks", ``norm_c4_plan`` and ``layer_norm_full2_plan``
    declining every row; "four_chunks", ``norm_c4_plan`` giving rms_norm's float rows layer_norm's 4-chunk plan
    (rms_norm_fwd_c4<float>: 56-64 registers, no spills on sm_90); else as shipped."""
    saved = launch_norm.norm_c4_plan, launch_norm.layer_norm_full2_plan
    c4 = saved[0]
    if name == "two_chunks":
        launch_norm.norm_c4_plan = launch_norm.layer_norm_full2_plan = lambda *a, **k: None
    elif name == "four_chunks":
        launch_norm.norm_c4_plan = lambda rows, cols, itemsize, props, arrays=2: c4(
            rows, cols, itemsize, props, 2 if itemsize == 4 else arrays)
    try:
        yield
    finally:
        launch_norm.norm_c4_plan, launch_norm.layer_norm_full2_plan = saved


def main() -> None:
    import torch
    import torch.nn.functional as F

    from opsmith import ops
    from opsmith.ops import _launch_norm, _norms

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shapes", default="", help="ROWSxCOLS,... in place of the default shapes")
    ap.add_argument("--ops", default="rms_norm,layer_norm")
    ap.add_argument("--variants", default="shipped,two_chunks,compile",
                    help="of shipped, two_chunks, four_chunks (float rms_norm at 4 chunks), compile")
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)

    def ln(x, w):
        return _norms.layer_norm_fwd(x, (x.shape[-1],), w, w, 1e-5)[0]

    def rms(x, w):
        return _norms.rms_norm_fwd(x, (x.shape[-1],), w, 1e-6)[0]

    def ln_torch(x, w):
        return F.layer_norm(x, (x.shape[-1],), w, w, 1e-5)

    def rms_torch(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)

    shapes = [(512, 1024), (2048, 1024), (1024, 2048), (2048, 2048), (4096, 2048), (1024, 4096), (2048, 4096),
              (4096, 4096), (1024, 8192), (2048, 8192)]
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "dtype": args.dtype,
           "copy_gbps": ops.copy_bandwidth(), "cases": []}
    print(f"{out['device']}, {args.dtype}, copy {out['copy_gbps']:.0f} GB/s", flush=True)
    variants = args.variants.split(",")
    for op, f, ref in (("rms_norm", rms, rms_torch), ("layer_norm", ln, ln_torch)):
        if op not in args.ops.split(","):
            continue
        for rows, cols in shapes:
            torch.manual_seed(0)
            x = torch.randn(rows, cols, dtype=dt, device="cuda")
            w = torch.randn(cols, dtype=dt, device="cuda")
            nbytes = 2 * x.nbytes
            torch._dynamo.reset()  # a fresh compile a shape (the peers benchmark's): no recompile limit
            compiled = torch.compile(ref, dynamic=False)
            want = ref(x.double(), w.double())
            for v in variants:
                if v != "compile":
                    with _variant(_launch_norm, v):
                        err = (f(x, w).double() - want).abs().max().item()
                    assert err < 0.1, (op, rows, cols, v, err)
            compiled(x, w)
            per = {v: [] for v in variants}
            for rnd in range(args.rounds):
                order = list(per) if rnd % 2 == 0 else list(reversed(per))
                for v in order:
                    if v == "compile":
                        t = ops.benchmark(lambda: compiled(x, w), runs=args.runs)
                    else:
                        with _variant(_launch_norm, v):
                            t = ops.benchmark(lambda: f(x, w), runs=args.runs)
                    per[v].append(t.median_ms * 1e3)
            us = {v: statistics.median(t) for v, t in per.items()}
            row = {"op": op, "rows": rows, "cols": cols, "us": us, "rounds_us": per,
                   "gbps": {v: nbytes / t / 1e3 for v, t in us.items()}}
            out["cases"].append(row)
            base = us.get("compile")
            print(f"{op:10s} {rows:>5d}x{cols:<5d} " + " | ".join(
                f"{v} {t:7.2f} us" + (f" ({base / t:.3f}x compile)" if base and v != "compile" else "")
                for v, t in us.items()), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
