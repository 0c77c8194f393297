#!/usr/bin/env python3
"""Benchmark opsmith.ops against torch eager, torch.compile and the tutorial's naive ReLU kernel.

Every figure is GB/s of the op's bytes-moved floor (each input read once, each output written
once) over the median time of CUDA-event-timed runs with the L2 flushed before each
(opsmith.ops.benchmark), and that as a fraction of the device's measured device-to-device
copy bandwidth: the practical roofline of a memory-bound op. Backward timings are
``torch.autograd.grad`` over a graph built once (the backward kernels, for every implementation).

Sweep: elementwise ops (relu, gelu, gelu tanh, silu; fwd and bwd) at 1 to 256 MiB in float32
and bfloat16; softmax, layer_norm, rms_norm (fwd and bwd) on rows 1 .. 65536 x row length
64 .. 32768 (at most 2^28 elements) in bfloat16. torch.compile runs with its defaults (it
recompiles with dynamic shapes after the second shape).

    python3 bench/bench_ops.py --out bench/results/ops-h100      # results.json, ops.png, table.txt
    python3 bench/bench_ops.py --out DIR --plot-only DIR/results.json  # redraw without a GPU
    python3 bench/bench_ops.py --peers --out DIR   # issue 23's comparison: eager, torch.compile(dynamic=False)
                                                   # per shape and Liger-Kernel, fwd and fwd+bwd (bench_ops_peers.py)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsmith import ops

MIB = 1 << 20
EW_SIZES_MIB = [1, 4, 16, 64, 256]
ROWS = [1, 64, 1024, 8192, 65536]
COLS = [64, 512, 1024, 4096, 8192, 32768]
MAX_NUMEL = 1 << 28


def _dt(name: str) -> torch.dtype:
    return getattr(torch, name)


# -- the implementations of each op: fn(x, w, b) -> y ------------------------------------------------------
def ew_impls(op: str):
    ref = {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
           "silu": F.silu}[op]
    ours = {"relu": ops.relu, "gelu": ops.gelu, "gelu_tanh": lambda x: ops.gelu(x, "tanh"), "silu": ops.silu}[op]
    return {"opsmith": ours, "torch": ref, "torch.compile": torch.compile(lambda x: ref(x))}


def row_impls(op: str):
    if op == "softmax":
        ours, ref = (lambda x, w, b: ops.softmax(x, -1)), (lambda x, w, b: torch.softmax(x, -1))
    elif op == "layer_norm":
        ours = lambda x, w, b: ops.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
        ref = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
    else:
        ours = lambda x, w, b: ops.rms_norm(x, (x.shape[-1],), w, 1e-6)
        ref = lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    compiled = torch.compile(lambda x, w, b: ref(x, w, b))
    return {"opsmith": ours, "torch": ref, "torch.compile": compiled}


def naive_relu():
    """The tutorial's kernel (examples/tutorial_relu/relu_kernel.cu) through NVRTC: one float a thread."""
    from opsmith._torch._cuda_module import CudaModule
    text = (ROOT / "examples/tutorial_relu/relu_kernel.cu").read_text()
    text = text.split("void relu_cuda_launcher")[0].replace("#include <cuda_runtime.h>", "")
    kernel = CudaModule(text, name="tutorial_relu_kernel.cu").get_kernel("relu_kernel")

    def relu(x):
        y = torch.empty_like(x)
        n = x.numel()
        kernel((-(-n // 256),), (256,), (x, y, n))
        return y
    return relu


# -- bytes-moved floors ----------------------------------------------------------------------------------
def ew_bytes(x, direction):
    return (2 if direction == "fwd" else 3) * x.nbytes


def row_bytes(op, x, direction):
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    s = x.element_size()
    big = (2 if direction == "fwd" else 3) * x.nbytes
    params = {"softmax": 0, "layer_norm": 2, "rms_norm": 1}[op]
    stats = {"softmax": 0, "layer_norm": 8, "rms_norm": 4}[op] * rows
    # fwd reads the params and writes the stats; bwd reads w and the stats and writes the param grads
    return big + stats + (params * cols * s if direction == "fwd" else (min(params, 1) + params) * cols * s)


# -- timing ----------------------------------------------------------------------------------------------
def time_fwd(fn, args, nbytes, runs):
    with torch.no_grad():
        return ops.benchmark(fn, *args, bytes_moved=nbytes, runs=runs, warmup=3)


def time_bwd(fn, args, grad, nbytes, runs):
    leaves = [a for a in args if a is not None and a.requires_grad]
    y = fn(*args)
    return ops.benchmark(lambda: torch.autograd.grad(y, leaves, grad, retain_graph=True), bytes_moved=nbytes,
                         runs=runs, warmup=3, device=args[0].device)


def measure(impls, make_args, nbytes, direction, runs):
    out = {}
    for name, fn in impls.items():
        try:
            args = make_args(direction == "bwd")
            if direction == "fwd":
                r = time_fwd(fn, args, nbytes, runs)
            else:
                grad = torch.randn_like(args[0])
                r = time_bwd(fn, args, grad, nbytes, runs)
            out[name] = {"ms": r.median_ms, "gbps": r.gbps, "fraction": r.fraction}
        except Exception as exc:  # noqa: BLE001 -- one implementation failing (no Triton ...) must not end the run
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        torch.cuda.synchronize()
    return out


def main() -> int:
    if "--peers" in sys.argv:  # opsmith.ops beside eager, compile(dynamic=False) and Liger (bench_ops_peers.py)
        sys.argv.remove("--peers")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_ops_peers import main as peers
        return peers()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for results.json, table.txt, ops.png")
    ap.add_argument("--plot-only", type=Path, metavar="RESULTS_JSON",
                    help="no GPU: redraw ops.png and table.txt under --out from an earlier results.json")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per figure (median)")
    ap.add_argument("--ew-dtypes", default="float32,bfloat16", help='"" leaves the elementwise ops out')
    ap.add_argument("--row-dtypes", default="bfloat16", help='"" leaves the row ops out')
    ap.add_argument("--row-ops", default="softmax,layer_norm,rms_norm")
    ap.add_argument("--budget-s", type=float, default=210, help="stop measuring new points after this")
    ap.add_argument("--quick", action="store_true", help="a few points only (a smoke test)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        data = json.loads(args.plot_only.read_text())
        (args.out / "table.txt").write_text(render(data["records"], data["meta"], data["summary"]))
        plot(data["records"], data["meta"], args.out / "ops.png")
        return 0
    start = time.perf_counter()
    # the backward timings call autograd.grad with retain_graph=True on one graph, which a
    # compiled backward with donated buffers refuses
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    copy = ops.copy_bandwidth(dev)
    meta = {"device": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "copy_gbps": copy, "runs": args.runs,
            "command": "python3 bench/bench_ops.py " + " ".join(sys.argv[1:])}
    print(f"{props.name}: device-to-device copy {copy:.0f} GB/s", flush=True)
    t = time.perf_counter()
    ops.relu(torch.zeros(1, device="cuda"))  # compiles this dtype's programs (cold time below)
    ops.relu(torch.zeros(1, device="cuda", dtype=torch.bfloat16))
    meta["first_use_s"] = time.perf_counter() - t
    records = []
    skipped = 0
    sizes = EW_SIZES_MIB[::2] if args.quick else EW_SIZES_MIB
    try:
        naive = naive_relu()
    except Exception as exc:  # noqa: BLE001 -- the tutorial kernel is an anchor, not a reason to lose the run
        print(f"tutorial kernel unavailable: {type(exc).__name__}: {exc}", flush=True)
        naive = None

    def over_budget():
        return time.perf_counter() - start > args.budget_s

    for dtype_name in filter(None, args.ew_dtypes.split(",")):
        dtype = _dt(dtype_name)
        for op in ("relu", "gelu", "gelu_tanh", "silu"):
            impls = ew_impls(op)
            if op == "relu" and dtype == torch.float32 and naive is not None:
                impls["tutorial"] = naive
            for direction in ("fwd", "bwd"):
                for mib in sizes:
                    if over_budget():
                        skipped += 1
                        continue
                    n = mib * MIB // torch.tensor([], dtype=dtype).element_size()
                    mk = lambda grad, n=n, dtype=dtype: (torch.randn(n, device="cuda", dtype=dtype).requires_grad_(grad),)
                    use = impls if direction == "fwd" else {k: v for k, v in impls.items() if k != "tutorial"}
                    x0 = mk(False)[0]
                    res = measure(use, mk, ew_bytes(x0, direction), direction, args.runs)
                    records.append({"op": op, "dir": direction, "dtype": dtype_name, "shape": [n],
                                    "bytes": ew_bytes(x0, direction), "results": res})
                    del x0
    shapes = [(r, c) for r in ROWS for c in COLS if r * c <= MAX_NUMEL]
    if args.quick:
        shapes = shapes[::5]
    for dtype_name in filter(None, args.row_dtypes.split(",")):
        dtype = _dt(dtype_name)
        for op in args.row_ops.split(","):
            impls = row_impls(op)
            for direction in ("fwd", "bwd"):
                for rows, cols in shapes:
                    if over_budget():
                        skipped += 1
                        continue

                    def mk(grad, rows=rows, cols=cols, dtype=dtype, op=op):
                        x = torch.randn(rows, cols, device="cuda", dtype=dtype).requires_grad_(grad)
                        w = None if op == "softmax" else torch.randn(cols, device="cuda", dtype=dtype).requires_grad_(grad)
                        b = torch.randn(cols, device="cuda", dtype=dtype).requires_grad_(grad) if op == "layer_norm" else None
                        return x, w, b
                    x0 = torch.empty(rows, cols, device="cuda", dtype=dtype)
                    nbytes = row_bytes(op, x0, direction)
                    res = measure(impls, mk, nbytes, direction, args.runs)
                    records.append({"op": op, "dir": direction, "dtype": dtype_name, "shape": [rows, cols],
                                    "bytes": nbytes, "results": res})
                    del x0
    meta["seconds"] = time.perf_counter() - start
    meta["skipped_over_budget"] = skipped
    summary = summarize(records)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "records": records}, indent=1))
    table = render(records, meta, summary)
    (args.out / "table.txt").write_text(table)
    plot(records, meta, args.out / "ops.png")
    print(table)
    return 0


# -- summary against the targets -------------------------------------------------------------------
def _ms(rec, impl):
    r = rec["results"].get(impl) or {}
    return r.get("ms")


def summarize(records):
    out = {}
    ew = [r for r in records if r["op"] in ("relu", "gelu", "gelu_tanh", "silu") and r["bytes"] >= 2 * 64 * MIB]
    fr = [r["results"]["opsmith"].get("fraction") for r in ew if r["results"]["opsmith"].get("fraction")]
    out["elementwise_min_fraction_at_64MiB_plus"] = min(fr) if fr else None
    out["elementwise_target_0.98_met"] = bool(fr) and min(fr) >= 0.98
    rows = [r for r in records if r["op"] in ("softmax", "layer_norm", "rms_norm")]
    large = [r for r in rows if math.prod(r["shape"]) >= 1 << 24]
    fr = [r["results"]["opsmith"].get("fraction") for r in large if r["results"]["opsmith"].get("fraction")]
    out["rows_min_fraction_at_2^24_elements_plus"] = min(fr) if fr else None
    out["rows_target_0.90_met"] = bool(fr) and min(fr) >= 0.90
    both = [r for r in rows if _ms(r, "opsmith") and _ms(r, "torch")]
    slower = [r for r in both if _ms(r, "opsmith") > _ms(r, "torch")]
    out["rows_slower_than_eager"] = [f"{r['op']} {r['dir']} {r['shape']}: {_ms(r, 'opsmith') / _ms(r, 'torch'):.2f}x"
                                     for r in slower]
    out["rows_never_slower_than_eager"] = bool(both) and not slower  # (no row measured: not met)
    out["rows_compared_with_eager"] = len(both)
    comp = [r for r in rows if _ms(r, "opsmith") and _ms(r, "torch.compile")]
    wins = sum(_ms(r, "opsmith") <= _ms(r, "torch.compile") for r in comp)
    out["rows_as_fast_as_compile_share"] = wins / len(comp) if comp else None
    out["rows_compile_target_0.80_met"] = bool(comp) and wins / len(comp) >= 0.80
    return out


def _cell(rec, impl):
    r = rec["results"].get(impl)
    if r is None:
        return "-"
    if "error" in r:
        return "error"
    return f"{r['gbps']:6.0f} {r['fraction']:4.0%}"


def render(records, meta, summary):
    impls = ["opsmith", "torch", "torch.compile", "tutorial"]
    lines = [f"{meta['device']}  copy {meta['copy_gbps']:.0f} GB/s  (GB/s of the bytes-moved floor, and % of copy)",
             f"{'op':10} {'dir':3} {'dtype':8} {'shape':>14} {'MiB':>7} | " +
             " | ".join(f"{i:>11}" for i in impls) + " | ours/torch ours/compile (time ratio; <1 faster)"]
    for r in records:
        o, t, c = _ms(r, "opsmith"), _ms(r, "torch"), _ms(r, "torch.compile")
        ratio = lambda a, b: f"{a / b:10.2f}" if a and b else "         -"
        lines.append(f"{r['op']:10} {r['dir']:3} {r['dtype']:8} {'x'.join(map(str, r['shape'])):>14} "
                     f"{r['bytes'] / MIB:7.1f} | " + " | ".join(f"{_cell(r, i):>11}" for i in impls)
                     + f" | {ratio(o, t)} {ratio(o, c)}")
    lines.append("")
    for k, v in summary.items():
        lines.append(f"{k}: {v}")
    lines.append(f"first use (compile) {meta['first_use_s']:.1f} s; whole run {meta['seconds']:.0f} s; "
                 f"points skipped over the time budget: {meta['skipped_over_budget']}")
    return "\n".join(lines) + "\n"


def plot(records, meta, path):
    from bench import _plot
    _plot.panels(records, {"opsmith": "o-", "torch": "s--", "torch.compile": "^:", "tutorial": "x-."}, path,
                 f"opsmith.ops on {meta['device']} (copy roofline {meta['copy_gbps']:.0f} GB/s)", meta["copy_gbps"],
                 points_only=lambda op: op in ("softmax", "layer_norm", "rms_norm"))

if __name__ == "__main__":
    raise SystemExit(main())
