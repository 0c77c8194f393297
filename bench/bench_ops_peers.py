#!/usr/bin/env python3
"""Issue 23's comparison: opsmith.ops beside torch eager, torch.compile(dynamic=False) compiled
for each shape, and Liger-Kernel, forward and forward+backward, in one process.

Every figure is GB/s of the bytes-moved floor over the median of CUDA-event-timed runs with the
L2 flushed (opsmith.ops.benchmark). A case's implementations (and its copy) are built first, on inputs of the
same values, then timed in --rounds rounds, each in turn, the order rotating: the figure is the median of its
rounds' medians, and ours' spread between its rounds ("±") is the case's noise, printed beside the ratio (a
difference smaller than that was not measured). "fwd+bwd" times one forward and one backward
(torch.autograd.grad) together, against the sum of both floors. Each case prints ours / the
best peer (time ratio: > 1 means ours is faster); each forward also times a device copy of the same
bytes ("copy", not a peer; at least COPY_RUNS runs), and the summary gives the forwards from 64 MiB as a share of the
device's copy bandwidth and of that same-size copy. torch.compile is reset and recompiled for
every shape (its default would recompile once with dynamic shapes and understate it). Liger is
used when importable (pure Python over Triton: carry its wheel, pip install --no-deps).

Ops: rms_norm, layer_norm, softmax, add_rms_norm, add_layer_norm (no Liger equivalent; rows 1 MiB .. >= 1 GiB moved, row length
1024 .. 32768), silu_and_mul / gelu_and_mul (packed [gate | up]; Liger gets gate and up as two
tensors, as its MLP has them), rotary (q and k [1, cols / 128 heads, rows, 128]; opsmith's
rotary_embedding_qk and Liger's liger_rope rotate both in one call), cross_entropy (logits [rows, vocabulary] for
vocabularies of 32000 and 128256, 1 target in 16 ignored, whose logits the floor does not count; eager and compile
run transformers' form, F.cross_entropy(logits.float(), target); Liger's liger_cross_entropy), in bfloat16 by
default.
cross_entropy is also timed as "fwd+bwd1": the upstream gradient exactly 1 (a plain
loss.backward()), where Liger skips its backward kernel.

    python3 bench/bench_ops_peers.py --out DIR            # results.json, table.txt
    python3 bench/bench_ops_peers.py --out DIR --quick    # a few shapes (a smoke test)
    python3 bench/bench_ops_peers.py --out DIR --plot-only DIR/results.json   # redraw peers.png, no GPU
    python3 bench/bench_ops_peers.py --out DIR --table-only DIR/results.json  # table.txt with this file's floors
    python3 bench/bench_ops_peers.py --out DIR --device cpu --quick   # the plumbing, on CPU (no Liger)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsmith import ops

MIB = 1 << 20
SHAPES = [(512, 1024), (2048, 2048), (4096, 4096), (16384, 4096), (65536, 1024), (4096, 16384), (2048, 32768),
          (8192, 8192), (32768, 8192), (65536, 8192)]
# hidden sizes that are not a power of two (Gemma's 3,072, Llama-13B's and Qwen-14B's 5,120): the plans' powers of two
# of threads left these rows' threads idle, which the powers of two above never show (docs/ops.md, "softmax's rows of
# whole warps")
SHAPES += [(8192, 3072), (16384, 5120)]
# the same-size copy's runs, at least: at 20 its median read 238 against 379-398 GB/s at 2 MiB in one run, and 895
# against 2,953-2,960 at 256 MiB (bench/results/ops-c4-bounds-h100-2026-11-27/peers-table.txt), which put a
# forward at 299 % "of a copy of the same bytes"
COPY_RUNS = 100
# cross_entropy: the targets ignored (-100), every this many rows from the first; their logits need not be read
IGNORED_EVERY = 16
CE_SHAPES = [(4096, 32000), (8192, 32000), (16384, 32000), (4096, 128256), (8192, 128256)]  # rows x vocabulary


def _liger():
    try:
        from liger_kernel.transformers import functional as lf
        return lf
    except Exception:  # noqa: BLE001 -- not installed (or no Triton): the column is left out
        return None


def _liger_version():
    """Liger-Kernel's version from its installed metadata (the package has no __version__)."""
    from importlib import metadata
    try:
        return metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        return "unknown"


def impls(op: str, liger):
    """name -> (make_args(rows, cols, dtype, device, grad), fn(*args)) for ``op``."""
    def row_args(rows, cols, dtype, device, grad, params):
        x = torch.randn(rows, cols, dtype=dtype, device=device, requires_grad=grad)
        ps = [torch.randn(cols, dtype=dtype, device=device, requires_grad=grad) for _ in range(params)]
        return (x, *ps)

    def gated_args(rows, cols, dtype, device, grad):
        return (torch.randn(rows, 2 * cols, dtype=dtype, device=device, requires_grad=grad),)

    def split_args(rows, cols, dtype, device, grad):  # Liger: gate and up as two tensors
        return tuple(torch.randn(rows, cols, dtype=dtype, device=device, requires_grad=grad) for _ in range(2))

    if op in ("rms_norm", "layer_norm", "softmax"):
        params = {"rms_norm": 1, "layer_norm": 2, "softmax": 0}[op]
        mk = lambda r, c, dt, dev, g: row_args(r, c, dt, dev, g, params)
        eager = {"rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
                 "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
                 "softmax": lambda x: torch.softmax(x, -1)}[op]
        ours = {"rms_norm": lambda x, w: ops.rms_norm(x, (x.shape[-1],), w, 1e-6),
                "layer_norm": lambda x, w, b: ops.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
                "softmax": lambda x: ops.softmax(x, -1)}[op]
        out = {"opsmith": (mk, ours), "eager": (mk, eager), "compile": (mk, eager)}
        if liger is not None:
            out["liger"] = (mk, {"rms_norm": lambda x, w: liger.liger_rms_norm(x, w, 1e-6),
                                 "layer_norm": lambda x, w, b: liger.liger_layer_norm(x, w, b, 1e-5),
                                 "softmax": lambda x: liger.liger_softmax(x)}[op])
        return out
    if op == "rotary":  # q and k [1, heads, rows, 128], heads = cols // 128; cos/sin [rows, 64]
        def rot_args(r, c, dt, dev, g):
            heads = max(c // 128, 1)
            q, k = (torch.randn(1, heads, r, 128, dtype=dt, device=dev, requires_grad=g) for _ in range(2))
            ang = torch.randn(r, 64, device=dev)
            return q, k, ang.cos().to(dt), ang.sin().to(dt)

        def eager_rot(q, k, cos, sin):
            c, s = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
            half = lambda t: torch.cat([-t[..., 64:], t[..., :64]], -1)  # noqa: E731
            return q * c + half(q) * s, k * c + half(k) * s
        out = {"opsmith": (rot_args, ops.rotary_embedding_qk),  # one launch for q and k, as compile's
               "eager": (rot_args, eager_rot), "compile": (rot_args, eager_rot)}
        if liger is not None:
            out["liger"] = (rot_args, lambda q, k, c, s: liger.liger_rope(q, k, torch.cat([c, c], -1)[None],
                                                                          torch.cat([s, s], -1)[None]))
        return out
    if op == "cross_entropy":  # logits [rows, cols = vocabulary], mean over the targets not ignored
        def ce_args(r, c, dt, dev, g):
            t = torch.randint(0, c, (r,), device=dev)
            t[::IGNORED_EVERY] = -100
            return torch.randn(r, c, dtype=dt, device=dev, requires_grad=g), t

        def eager_ce(x, t):
            return F.cross_entropy(x.float(), t)  # as transformers' loss: the logits upcast first
        out = {"opsmith": (ce_args, lambda x, t: ops.cross_entropy(x, t)), "eager": (ce_args, eager_ce),
               "compile": (ce_args, eager_ce)}
        if liger is not None:  # it writes the gradient into the logits (no matter for the timing)
            out["liger"] = (ce_args, lambda x, t: liger.liger_cross_entropy(x, t))
        return out
    if op == "add_rms_norm":
        # y and the new residual, from every implementation: the next layer reads the residual, and a
        # compiled function that returned y alone would never write it (Inductor drops the dead store:
        # up to 5,787 GB/s "of the floor" in bench/results/ops-fwd-h200-2026-11-26/table.txt, which
        # timed y alone)
        mk = lambda r, c, dt, dev, g: (*row_args(r, c, dt, dev, g, 1), torch.randn(r, c, dtype=dt, device=dev,
                                                                                   requires_grad=g))

        def eager_add(x, w, res):
            s = x + res
            return F.rms_norm(s, (x.shape[-1],), w, 1e-6), s
        out = {"opsmith": (mk, lambda x, w, res: ops.add_rms_norm(x, res, (x.shape[-1],), w, 1e-6)),
               "eager": (mk, eager_add), "compile": (mk, eager_add)}
        if liger is not None and hasattr(liger, "liger_fused_add_rms_norm"):
            out["liger"] = (mk, lambda x, w, res: liger.liger_fused_add_rms_norm(x, res, w, 1e-6, in_place=False))
        return out
    if op == "add_layer_norm":  # as add_rms_norm: y and the new residual from every implementation; Liger has none
        mk = lambda r, c, dt, dev, g: (*row_args(r, c, dt, dev, g, 2), torch.randn(r, c, dtype=dt, device=dev,
                                                                                   requires_grad=g))

        def eager_add_ln(x, w, b, res):
            s = x + res
            return F.layer_norm(s, (x.shape[-1],), w, b, 1e-5), s
        return {"opsmith": (mk, lambda x, w, b, res: ops.add_layer_norm(x, res, (x.shape[-1],), w, b, 1e-5)),
                "eager": (mk, eager_add_ln), "compile": (mk, eager_add_ln)}
    act = {"silu_and_mul": F.silu, "gelu_and_mul": lambda g: F.gelu(g, approximate="tanh")}[op]
    ours = {"silu_and_mul": ops.silu_and_mul, "gelu_and_mul": lambda x: ops.gelu_and_mul(x, "tanh")}[op]

    def eager(x):
        d = x.shape[-1] // 2
        return act(x[..., :d]) * x[..., d:]
    out = {"opsmith": (gated_args, ours), "eager": (gated_args, eager), "compile": (gated_args, eager)}
    if liger is not None:  # Liger's GeGLU is the tanh form
        out["liger"] = (split_args, {"silu_and_mul": liger.liger_swiglu, "gelu_and_mul": liger.liger_geglu}[op])
    return out


def floor_bytes(op: str, rows: int, cols: int, size: int, direction: str) -> int:
    """The bytes each direction must move at least (fwd: inputs read, outputs written)."""
    n = rows * cols * size
    if op in ("silu_and_mul", "gelu_and_mul"):
        fwd, bwd = 3 * n, 5 * n  # x (2n) -> y (n); g (n) + x (2n) -> dx (2n)
    elif op == "rotary":  # q and k of rows * (cols // 128 heads) * 128 each: read and written
        qk = rows * max(cols // 128, 1) * 128 * size
        fwd, bwd = 4 * qk + 2 * rows * 64 * size, 4 * qk + 2 * rows * 64 * size
    elif op == "cross_entropy":  # fwd: the logits of the rows not ignored and the targets read; bwd: those logits
        # read, the whole gradient written (zeros for the rows ignored)
        valid = (rows - -(-rows // IGNORED_EVERY)) * cols * size
        fwd, bwd = valid + 8 * rows, valid + n + 8 * rows
    elif op == "add_rms_norm":  # x, residual -> y, residual_out (+ w, rstd); bwd: g, s -> dx, dres (+ dw)
        fwd, bwd = 4 * n + cols * size + 4 * rows, 4 * n + 2 * cols * size + 4 * rows
    elif op == "add_layer_norm":  # as add_rms_norm, with the bias (and its gradient) and the mean
        fwd, bwd = 4 * n + 2 * cols * size + 8 * rows, 4 * n + 4 * cols * size + 8 * rows
    else:
        params = {"rms_norm": 1, "layer_norm": 2, "softmax": 0}[op] * cols * size
        stats = {"rms_norm": 4, "layer_norm": 8, "softmax": 0}[op] * rows
        fwd, bwd = 2 * n + params + stats, 3 * n + 2 * params + stats
    return fwd if direction == "fwd" else fwd + bwd


def _time(fn, nbytes, runs, device):
    if device == "cpu":  # the plumbing only: wall time
        ts = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        ms = statistics.median(ts)
        return {"ms": ms, "gbps": nbytes / (ms * 1e-3) / 1e9}
    r = ops.benchmark(fn, bytes_moved=nbytes, runs=runs, warmup=3, device=torch.device(device))
    return {"ms": r.median_ms, "gbps": r.gbps, "fraction": r.fraction}


def _copy(nbytes, device):
    """A device-to-device copy of nbytes / 2 bytes and the bytes it moves, timed as the ops are: what "% of copy"
    means at this size (below about 256 MiB a copy itself stays short of the large copy's bandwidth)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * src.numel()


def _error(exc: Exception) -> dict:
    """A failed implementation's record: its error, shortened."""
    return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _spread(ms) -> float | None:
    """How far apart the slowest and the fastest of one implementation's rounds are (0.012: 1.2 %)."""
    return max(ms) / min(ms) - 1 if ms and len(ms) > 1 else None


def prepare(name, make, fn, rows, cols, dtype, device, direction):
    """The call timed for implementation ``name`` of this case, run once (compiled, its kernels loaded): a
    forward under no_grad, or a forward and ``torch.autograd.grad`` of its outputs."""
    if name == "compile":
        torch._dynamo.reset()
        fn = torch.compile(fn, dynamic=False)
    grad = direction != "fwd"
    torch.manual_seed(0)  # every implementation gets inputs of the same values
    args = make(rows, cols, dtype, device, grad)
    if not grad:
        def forward():
            with torch.no_grad():
                fn(*args)
        forward()
        return forward
    leaves = [a for a in args if a.requires_grad]
    y = fn(*args)
    ys = tuple(y) if isinstance(y, (tuple, list)) else (y,)
    g = tuple((torch.ones_like(t) if direction == "fwd+bwd1" else torch.randn_like(t)) for t in ys)
    torch.autograd.grad(ys, leaves, g)

    def step():
        out = fn(*args)
        torch.autograd.grad(tuple(out) if isinstance(out, (tuple, list)) else (out,), leaves, g)
    return step


def measure_case(calls, rounds, device) -> dict:
    """Time ``calls`` (name -> (call, bytes moved, runs)) in ``rounds`` rounds, each in turn, the order rotating
    from round to round: each figure is the median of its rounds' medians, so that a drift of the machine falls on
    every implementation alike, and ``rounds_ms`` keeps the rounds (the spread of ours between its rounds is the
    case's noise: a difference smaller than that is not measured). A call that fails keeps its error."""
    res, per = {}, {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name in res:  # failed in an earlier round
                continue
            call, moved, n = calls[name]
            try:
                per[name].append(_time(call, moved, n, device)["ms"])
            except Exception as exc:  # noqa: BLE001 -- one peer failing must not end the run
                res[name] = _error(exc)
    for name, ms in per.items():
        if name not in res:
            med = statistics.median(ms)
            res[name] = {"ms": med, "gbps": calls[name][1] / (med * 1e-3) / 1e9, "rounds_ms": ms}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ops", default="rms_norm,layer_norm,softmax,add_rms_norm,add_layer_norm,silu_and_mul,gelu_and_mul,"
                                     "rotary,cross_entropy")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--runs", type=int, default=20, help="timed runs a round (the copy: at least COPY_RUNS)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of each case's implementations in turn (the figure: the median of the rounds)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", help="ROWSxCOLS,... in place of the sweep's shapes (cross_entropy keeps its own)")
    ap.add_argument("--budget-s", type=float, default=400, help="stop starting new cases after this")
    ap.add_argument("--flush", default="zero", choices=("zero", "last"),
                    help="the L2 flush before each run: zero, the benchmark's (do_bench's); last, one that first "
                         "displaces the lines a kernel loaded under evict_last (bench/_flush.py)")
    ap.add_argument("--plot-only", type=Path, metavar="RESULTS_JSON",
                    help="redraw peers.png in --out from a results.json (no GPU needed)")
    ap.add_argument("--table-only", type=Path, metavar="RESULTS_JSON",
                    help="write table.txt in --out from a results.json's times, GB/s over this file's floors "
                         "(the copy's as measured; no GPU needed)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.table_only:
        data = json.loads(args.table_only.read_text())
        records = refloor(data["records"])
        meta = {**data["meta"], "table": " ".join(["GB/s over the floors of bench/bench_ops_peers.py", *sys.argv[1:]])}
        (args.out / "table.txt").write_text("\n".join([f"{meta}", _header(), *(_line(r) for r in records)]) + "\n")
        print(_summary(records, meta))
        return 0
    if args.plot_only:
        data = json.loads(args.plot_only.read_text())
        plot(data["records"], data["meta"], args.out / "peers.png")
        return 0
    import torch._functorch.config as functorch_config
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _flush import flush_mode  # bench/_flush.py
    functorch_config.donated_buffer = False
    liger = _liger() if args.device != "cpu" else None
    start = time.perf_counter()
    meta = {"torch": torch.__version__, "liger": _liger_version() if liger else None,
            "command": "python3 bench/bench_ops_peers.py " + " ".join(sys.argv[1:]), "flush": args.flush}
    if args.device != "cpu":
        meta.update(device=torch.cuda.get_device_name(), copy_gbps=ops.copy_bandwidth())
    shapes = SHAPES[:3] if args.quick else SHAPES
    if args.shapes:
        shapes = [tuple(int(n) for n in t.split("x")) for t in args.shapes.split(",")]
    if args.device == "cpu":
        shapes = [(64, 256), (128, 512)]
    records, skipped = [], 0
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        size = torch.tensor([], dtype=dtype).element_size()
        for op in args.ops.split(","):
            op_shapes = shapes
            if op == "cross_entropy" and args.device != "cpu":
                op_shapes = CE_SHAPES[:2] if args.quick else CE_SHAPES
            directions = ("fwd", "fwd+bwd", "fwd+bwd1") if op == "cross_entropy" else ("fwd", "fwd+bwd")
            for rows, cols in op_shapes:
                for direction in directions:
                    nbytes = floor_bytes(op, rows, cols, size, direction)
                    if time.perf_counter() - start > args.budget_s:
                        skipped += 1
                        continue
                    calls, failed = {}, {}
                    for name, (make, fn) in impls(op, liger).items():
                        try:
                            calls[name] = (prepare(name, make, fn, rows, cols, dtype, args.device, direction),
                                           nbytes, args.runs)
                        except Exception as exc:  # noqa: BLE001 -- one peer failing must not end the run
                            failed[name] = _error(exc)
                    if direction == "fwd" and args.device != "cpu":  # the target's reference at this size
                        calls["copy"] = (*_copy(nbytes, args.device), max(args.runs, COPY_RUNS))
                    with flush_mode(args.flush):  # on the CPU no flush runs: the plumbing times wall clock
                        res = {**measure_case(calls, args.rounds, args.device), **failed}
                    del calls
                    peers = [r["ms"] for k, r in res.items() if k not in ("opsmith", "copy") and "ms" in r]
                    ratio = (min(peers) / res["opsmith"]["ms"]) if peers and "ms" in res["opsmith"] else None
                    records.append({"op": op, "dtype": dtype_name, "shape": [rows, cols], "dir": direction,
                                    "bytes": nbytes, "results": res, "vs_best_peer": ratio,
                                    "noise": _spread(res.get("opsmith", {}).get("rounds_ms"))})
                    print(_line(records[-1]), flush=True)
    meta["seconds"], meta["skipped_over_budget"] = time.perf_counter() - start, skipped
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    table = "\n".join([f"{meta}", _header(), *(_line(r) for r in records)])
    (args.out / "table.txt").write_text(table + "\n")
    if args.device != "cpu":
        plot(records, meta, args.out / "peers.png")
    print(_summary(records, meta))
    return 0


def refloor(records) -> list:
    """``records`` with each case's bytes from floor_bytes and every implementation's GB/s over them (the copy
    keeps its own: it moved the bytes it was timed with)."""
    out = []
    for r in records:
        size = torch.tensor([], dtype=getattr(torch, r["dtype"])).element_size()
        nbytes = floor_bytes(r["op"], *r["shape"], size, r["dir"])
        res = {k: v if k == "copy" or "ms" not in v else {**v, "gbps": nbytes / (v["ms"] * 1e-3) / 1e9}
               for k, v in r["results"].items()}
        out.append({**r, "bytes": nbytes, "results": res})
    return out


def plot(records, meta, path) -> None:
    """peers.png: a panel per op and direction, every implementation's GB/s against bytes moved."""
    from bench import _plot
    _plot.panels(records, {"opsmith": "o", "eager": "s", "compile": "^", "liger": "x"}, path,
                 f"opsmith.ops against its peers on {meta.get('device', '?')} (torch {meta.get('torch')})",
                 meta.get("copy_gbps"))

def _header() -> str:
    return f"{'op':<16}{'dtype':<9}{'shape':<14}{'dir':<8}{'MiB':>7}  GB/s: opsmith / eager / compile / liger   ours vs best"


def _line(r) -> str:
    cell = lambda k: f"{r['results'][k]['gbps']:.0f}" if "gbps" in r["results"].get(k, {}) else "-"
    ratio = f"{r['vs_best_peer']:.3f}x" if r["vs_best_peer"] else "-"
    if r.get("noise") is not None:
        ratio += f" ±{r['noise']:.1%}"
    copy = f"   copy {cell('copy')}" if "copy" in r["results"] else ""
    return (f"{r['op']:<16}{r['dtype']:<9}{'x'.join(map(str, r['shape'])):<14}{r['dir']:<8}{r['bytes'] / MIB:>7.0f}  "
            f"{cell('opsmith')} / {cell('eager')} / {cell('compile')} / {cell('liger')}   {ratio}{copy}")


def _summary(records, meta) -> str:
    big = [r for r in records if r["bytes"] >= 16 * MIB and r["vs_best_peer"]]
    losses = [r for r in big if r["vs_best_peer"] < 1]
    beyond = [r for r in losses if r["vs_best_peer"] < 1 - (r.get("noise") or 0)]
    out = (f"\n{len(big)} cases >= 16 MiB: ours >= the best peer in {len(big) - len(losses)}; behind in "
           f"{len(losses)} ({len(beyond)} by more than ours' own spread between rounds): "
           + ", ".join(f"{r['op']} {r['dir']} {'x'.join(map(str, r['shape']))} {r['vs_best_peer']:.3f}x"
                       + (f" ±{r['noise']:.1%}" if r.get("noise") is not None else "") for r in losses[:20]))
    return out + "".join(f"\n{line}" for line in fwd_shares(records, meta))


def fwd_shares(records, meta) -> list[str]:
    """Per op, its forwards from 64 MiB (rows up to 32,768) as a share of the device's copy bandwidth and of a
    copy of the same bytes (the issue's target: 90 %)."""
    lines = []
    for op in dict.fromkeys(r["op"] for r in records):
        fwd = [r for r in records if r["op"] == op and r["dir"] == "fwd" and r["bytes"] >= 64 * MIB
               and r["shape"][1] <= 32768 and "gbps" in r["results"].get("opsmith", {})]
        if not fwd or not meta.get("copy_gbps"):
            continue
        big = [r["results"]["opsmith"]["gbps"] / meta["copy_gbps"] for r in fwd]
        same = [r["results"]["opsmith"]["gbps"] / r["results"]["copy"]["gbps"] for r in fwd
                if r["results"].get("copy", {}).get("gbps")]
        line = (f"{op} fwd from 64 MiB: {min(big):.0%}-{max(big):.0%} of copy ({sum(f >= 0.9 for f in big)} of "
                f"{len(big)} at 90 % or more)")
        if same:
            line += (f"; {min(same):.0%}-{max(same):.0%} of a copy of the same bytes ({sum(f >= 0.9 for f in same)}"
                     f" of {len(same)})")
        lines.append(line)
    return lines


if __name__ == "__main__":
    sys.exit(main())
