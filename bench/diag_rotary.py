#!/usr/bin/env python3
r"""Issue 23: rotary_qk's launch variants beside torch.compile, Liger-Kernel and a copy. The H100 float32 sweep of
2026-12-06 had rotary at 0.93-0.99x compile(dynamic=False) on its middle shapes (2048x2048 forward 0.931x,
8192x3072 forward + backward 0.969x), while the shapes whose tables pass 8 MiB ran 1.07-1.20x. Times q and k
``[1, cols / 128 heads, rows, 128]`` with cos/sin ``[rows, 64]`` (bench_ops_peers.py's rotary case) rotated by
``_rotary.rotary_qk_cuda`` (the op's kernel launch; ``--direction fwd+bwd``: the forward, then the backward's rotation
of a random gradient) under each of ``--variants``, a variant being ``shipped`` or tokens joined by ``-``:

- ``rN``: rotary.cu compiled with ``OPSMITH_ROTARY_ROWS`` (and ``_HALF``) N, the plan at N rows a trip;
- ``yN``: N rows a block (blockDim.y; the threads a row as shipped, at most 256 a block);
- ``gN``: the grid capped at N blocks an SM for each of q and k (the kernel strides over the rest);
- ``bN``: rotary.cu compiled with ``OPSMITH_ROTARY_BLOCKS`` N (at least N blocks an SM: a register cap);
- ``mN`` (N 0 or 1): rotary.cuh's ``OPSMITH_ROTARY_FASTPOS`` (1, shipped: a table that follows the positions alone
  found with one modulo; 0: the divisions);
- ``hN`` (N 0 or 1): rotary.cuh's ``OPSMITH_ROTARY_TABLE_HINT`` (0, shipped: plain loads; 1: float's tables read
  under L2 evict_last);
- ``lN`` (N 0 or 1): rotary.cu's ``rotary_lean`` for float32's common case (``_rotary.LEAN_DTYPES``; 0: off,
  rotary_qk; 1, shipped: on, for tables of at most ``_rotary.LEAN_TABLE_BYTES``; the ``rN``, ``yN``, ``gN``,
  ``bN``, ``mN``, ``hN`` and ``kN`` settings shape rotary_qk alone);
- ``kN`` (N 0 or 1): ``_rotary.plan_qk``'s grid, q and k on alternating blocks (0) or on two rows of blocks (1),
  whatever the tables (shipped: two rows below ``_rotary.QK_HALVES_BELOW`` bytes of tables);
- ``two``: q and k in two launches (``_rotary.rotary_cuda`` each), not one;

and the peers: ``compile`` (bench_ops_peers' eager rotation under ``torch.compile(dynamic=False)``), ``liger``
(``liger_rope``), ``copy`` (a device copy of the same bytes); ``op``: ours through ``ops.rotary_embedding_qk`` and
autograd (the variants above launch the kernels directly), on the same inputs; ``sweep`` and ``sweep-compile``: the
call bench_ops_peers.py times for ours and for compile (its ``prepare``: each its own inputs, through autograd), to
tell the sweep's figures from this script's; ``lean``: ``diag_rotary_lean.cu``'s kernel, the rotation of this
case alone with the least work before the loads (30 registers for float against rotary_qk's 40), one launch for q
and k as rotary_qk, the backward the same kernel at sign -1 (bhsd only; checked against shipped to 4 ulp); ``pair``:
its ``rotary_pair``, a thread rotating row r of q and of k with one load of the table's vectors (compile's way);
``lean1``/``pair1``: the tables loaded L2 evict_last (compile's hint), ``lean2``/``pair2``: and x evict_first.

Each with ``opsmith.ops.benchmark`` (L2 flushed) in ``--rounds`` rounds, the variants in turn (the order rotating),
the figure the median of the rounds; every variant's output is checked against the shipped one first. Prints µs,
GB/s and each variant's ratio to "compile" (or to "shipped" without it); writes them to ``--json``.

    python3 bench/diag_rotary.py --dtype float32 --json rotary.json
    python3 bench/diag_rotary.py --shapes 2048x2048 --variants shipped,r2,y8,g8,r2-g8,compile,copy
    python3 bench/diag_rotary.py --direction fwd+bwd --variants shipped,lean,op,sweep,compile,sweep-compile
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_ops_peers import _copy, _liger, impls, prepare  # noqa: E402  (the sweep's rotary case and its call)
from _kernel_timing import kernel_from  # noqa: E402
from opsmith import ops  # noqa: E402
from opsmith.ops import _launch, _rotary, _sources  # noqa: E402

VARIANTS = "shipped,k0,k1,m0,compile,copy"
PEERS = ("compile", "liger", "copy", "op", "sweep", "sweep-compile")
AUTOGRAD = ("compile", "liger", "op", "sweep", "sweep-compile")  # timed under enable_grad for fwd+bwd
LEAN = ("lean", "lean1", "lean2", "pair", "pair1", "pair2")  # diag_rotary_lean.cu's kernel and L2 hints
_TOKEN = re.compile(r"^([rygbmkhl])(\d+)$")


def parse(variant: str) -> dict:
    """``variant``'s settings: {"r": rows a trip, "y": rows a block, "g": blocks an SM, "b": launch-bound blocks}
    (the ones it names); SystemExit on a token that is none of them."""
    if variant in ("shipped", "two") + LEAN + PEERS:
        return {}
    out = {}
    for tok in variant.split("-"):
        m = _TOKEN.match(tok)
        if not m or not (0 <= int(m.group(2)) <= 1 if m.group(1) in "mkhl" else int(m.group(2)) >= 1):
            raise SystemExit(f"diag_rotary: variant {variant!r}: {tok!r} is not rN, yN, gN, bN (N >= 1), m0, m1, "
                             f"k0, k1, h0, h1, l0 or l1, nor one of shipped, two, lean, {', '.join(PEERS)}")
        out[m.group(1)] = int(m.group(2))
    return out


def _defines(s: dict) -> dict:
    d = {}
    if "r" in s:
        d.update(OPSMITH_ROTARY_ROWS=s["r"], OPSMITH_ROTARY_ROWS_HALF=s["r"])
    if "b" in s:
        d["OPSMITH_ROTARY_BLOCKS"] = s["b"]
    if "m" in s:
        d["OPSMITH_ROTARY_FASTPOS"] = s["m"]
    if "h" in s:
        d["OPSMITH_ROTARY_TABLE_HINT"] = s["h"]
    return d


@contextlib.contextmanager
def variant(settings: dict, module, sms: int):
    """rotary.cu's kernel (``module``, compiled with the variant's defines) and plan of ``settings`` inside the
    block."""
    saved = _sources.kernel, _rotary._plan, _rotary.rows_a_trip, _rotary.QK_HALVES_BELOW, _rotary.LEAN_DTYPES
    if not settings:
        yield
        return

    def plan(rows, d, half, itemsize, props, trip=_rotary.ROTARY_ROWS):
        p = saved[1].__wrapped__(rows, d, half, itemsize, props, settings.get("r", trip))
        tpr, by = p.block
        if "y" in settings:
            by = max(1, min(settings["y"], _launch.EW_THREADS // tpr))
            per = p.grid[0] * p.block[1]  # rows a trip times the blocks: the rows the grid covers
            p = p._replace(block=(tpr, by), grid=(max(1, -(-per // by)),))
        if "g" in settings:
            p = p._replace(grid=(max(1, min(p.grid[0], settings["g"] * sms)),))
        return p
    _sources.kernel = kernel_from(module, "rotary.cu", saved[0])
    _rotary._plan = plan
    if "r" in settings:
        _rotary.rows_a_trip = lambda dt, full: settings["r"]
    if "k" in settings:
        _rotary.QK_HALVES_BELOW = 1 << 62 if settings["k"] else 0
    if "l" in settings:
        _rotary.LEAN_DTYPES = ("float32",) if settings["l"] else ()
    try:
        yield
    finally:
        (_sources.kernel, _rotary._plan, _rotary.rows_a_trip, _rotary.QK_HALVES_BELOW,
         _rotary.LEAN_DTYPES) = saved


def _lean_call(kern, q, k, cos, sin, gq, gk, bwd: bool, pair: bool = False):
    """diag_rotary_lean.cu's rotary_lean over q and k (and the backward's gq, gk at sign -1): the launch rotary_qk's
    plan gives, its grid as two rows (q's blocks, then k's); ``pair``: its rotary_pair, one grid row, a thread
    rotating row r of both (q and k of one shape)."""
    d, half = q.shape[-1], cos.shape[-1]
    n = 16 // q.element_size()
    if not (q.is_contiguous() and k.is_contiguous() and cos.is_contiguous() and sin.is_contiguous() and d == 2 * half
            and half % n == 0 and half // n <= _launch.EW_THREADS and cos.shape[0] == q.shape[-2] == k.shape[-2]
            and max(q.numel(), k.numel()) // d < 2**32):
        raise SystemExit(f"diag_rotary: lean takes contiguous q, k [.., seq, 2 * half] and tables [seq, half] of "
                         f"whole vectors, got q {tuple(q.shape)}, cos {tuple(cos.shape)}")
    rows_q, rows_k = q.numel() // d, k.numel() // d
    plan = _rotary._plan(max(rows_q, rows_k), d, half, q.element_size(), _launch.device_props(q.get_device()),
                         1)  # a row a thread (the plan's float16 takes 2 rows a trip)
    if pair and q.shape != k.shape:
        raise SystemExit(f"diag_rotary: pair takes q and k of one shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    cfg = _launch.launch_config(plan._replace(grid=(plan.grid[0], 1 if pair else 2)))
    rows = (rows_q,) if pair else (rows_q, rows_k)  # rotary_pair's one count of rows, rotary_lean's two

    def rotate(a, b, sign):
        ya, yb = torch.empty_like(a), torch.empty_like(b)
        kern.launch(cfg, a, b, cos, sin, ya, yb, *rows, half, cos.shape[0], sign)
        return ya, yb

    def call():
        out = rotate(q, k, 1)
        return rotate(gq, gk, -1) if bwd else out
    return call


def _profile(calls: dict, variants: list, bwd: bool, runs: int, shape: str) -> dict:
    """Each variant's call ``runs`` times under torch.profiler, L2 flushed before each (the flush's kernel left out):
    {variant: [[kernel, calls a step, mean µs], ...]}, printed as it goes."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    got = {}
    for v in variants:
        grad = torch.enable_grad() if v in AUTOGRAD and bwd else torch.no_grad()
        with grad:
            for _ in range(3):
                calls[v]()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(runs):
                    flush.zero_()
                    calls[v]()
                torch.cuda.synchronize()
        rows = [[e.key, e.count / runs, e.device_time_total / e.count] for e in prof.key_averages()
                if e.device_time_total > 0 and ("elementwise_kernel" not in e.key or v == "copy")]
        got[v] = rows
        total = sum(n * t for _, n, t in rows)
        print(f"{shape} {v}: {total:.2f} us of kernels a step", flush=True)
        for name, n, t in sorted(rows, key=lambda r: -r[1] * r[2]):
            print(f"    {n:4.1f} x {t:8.2f} us  {name[:110]}", flush=True)
    return got


def main() -> int:
    from opsmith._runtime import _driver
    from opsmith._torch._cuda_module import CudaModule

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--dtype", default="float32", help="bfloat16, float16 or float32")
    ap.add_argument("--shapes", default="2048x2048,4096x4096,8192x3072,8192x8192,4096x16384,16384x4096",
                    help="ROWSxCOLS,... as bench_ops_peers.py: q and k [1, COLS / 128, ROWS, 128]")
    ap.add_argument("--direction", default="fwd", choices=("fwd", "fwd+bwd"))
    ap.add_argument("--layout", default="bhsd", choices=("bhsd", "bshd"),
                    help="q and k in memory: [1, heads, rows, 128] (the sweep's), or [1, rows, heads, 128] seen as "
                         "[1, heads, rows, 128] (transformers' q.view(b, s, h, d).transpose(1, 2))")
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--ncu", action="store_true",
                    help="no timing: the first shape's forward, ours (rotary_qk_cuda) then compile's, twice each, for "
                         "Nsight Compute to read (gpu_check.sh ops NCU_ROTARY=1)")
    ap.add_argument("--profile", action="store_true",
                    help="no timing: each variant's call (L2 flushed before each) under torch.profiler, its kernels "
                         "listed with their mean device time, the first shape only")
    ap.add_argument("--ballast", default="",
                    help="MiB,...: each shape once for each, that many MiB allocated on the device before its inputs "
                         "(moves every tensor of the case to other addresses: does a ratio follow the placement?)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    variants = args.variants.split(",")
    if args.layout != "bhsd" and {"sweep", "sweep-compile", *LEAN} & set(variants):
        raise SystemExit("diag_rotary: lean and the sweep variants take contiguous [1, heads, rows, 128] q and k: "
                         "leave --layout at bhsd for them")
    settings = {v: parse(v) for v in variants}
    liger = _liger()
    if "liger" in variants and liger is None:
        print("Liger-Kernel not importable; its variant is left out", flush=True)
        variants.remove("liger")
    dt = getattr(torch, args.dtype)
    arch, props = _driver.device_arch(0), _launch.device_props(0)
    names = _sources.kernel_names("rotary.cu", args.dtype)
    modules = {v: CudaModule(_sources.KERNEL_DIR / "rotary.cu", name_expressions=names, arch=arch,
                             defines=_defines(s), name=f"diag-rotary-{v}") for v, s in settings.items() if _defines(s)}
    if set(LEAN) & set(variants):
        lean_t = _sources.DTYPES[args.dtype][0]
        lean_n = {v: f"rotary_{v[:4]}<{lean_t}, {v[4:] or 0}>" for v in LEAN}
        lean_m = CudaModule(Path(__file__).with_name("diag_rotary_lean.cu"), arch=arch, name="diag-rotary-lean",
                            name_expressions=list(lean_n.values()), include_paths=[_sources.KERNEL_DIR])
    peers = impls("rotary", liger)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "dtype": args.dtype,
           "direction": args.direction, "layout": args.layout, "copy_gbps": ops.copy_bandwidth(), "cases": []}
    print(f"{out['device']}, {args.dtype} {args.direction} {args.layout}, copy {out['copy_gbps']:.0f} GB/s", flush=True)
    bwd = args.direction == "fwd+bwd"
    if args.ncu:
        rows, cols = (int(v) for v in args.shapes.split(",")[0].split("x"))
        q, k, cos, sin = peers["opsmith"][0](rows, cols, dt, "cuda", False)
        if args.layout == "bshd":
            q, k = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k))
        compiled = torch.compile(peers["compile"][1], dynamic=False)
        with torch.no_grad():
            for f in (lambda: _rotary.rotary_qk_cuda(q, k, cos, sin), lambda: compiled(q, k, cos, sin)):
                for _ in range(2):
                    f()
        torch.cuda.synchronize()
        return 0
    ballasts = [int(b) for b in args.ballast.split(",")] if args.ballast else [None]
    for shape, ballast in ((s, b) for s in args.shapes.split(",") for b in ballasts):
        rows, cols = (int(v) for v in shape.split("x"))
        pad = None if ballast is None else torch.empty(ballast << 20, dtype=torch.uint8, device="cuda")
        torch.manual_seed(0)
        q, k, cos, sin = peers["opsmith"][0](rows, cols, dt, "cuda", False)
        if args.layout == "bshd":
            q, k = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k))
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        moved = 2 * 2 * q.numel() * q.element_size() * (2 if bwd else 1)
        calls = {}
        for v in variants:
            if v == "copy":
                calls[v] = _copy(moved, "cuda")[0]
            elif v in ("sweep", "sweep-compile"):  # the sweep's own call: its own inputs, through autograd
                name = "opsmith" if v == "sweep" else "compile"
                calls[v] = prepare(name, peers[name][0], peers[name][1], rows, cols, dt, "cuda", args.direction)
            elif v in ("compile", "liger", "op"):
                fn = peers["opsmith" if v == "op" else v][1]
                if v == "compile":
                    torch._dynamo.reset()
                    fn = torch.compile(fn, dynamic=False)
                if bwd:
                    qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()
                    calls[v] = (lambda fn=fn, qg=qg, kg=kg: torch.autograd.grad(fn(qg, kg, cos, sin), (qg, kg),
                                                                                (gq, gk)))  # noqa: B023
                else:
                    calls[v] = lambda fn=fn: fn(q, k, cos, sin)  # noqa: B023
            elif v in LEAN:
                calls[v] = _lean_call(lean_m.get_kernel(lean_n[v]), q, k, cos, sin, gq, gk, bwd,
                                      pair=v.startswith("pair"))
            elif v == "two":
                def two():
                    one = _rotary.rotary_cuda
                    yq, yk = one(q, cos, sin), one(k, cos, sin)  # noqa: B023
                    return (one(gq, cos, sin, sign=-1), one(gk, cos, sin, sign=-1)) if bwd else (yq, yk)  # noqa: B023
                calls[v] = two
            else:
                def ours(v=v):
                    with variant(settings[v], modules.get(v), props.sm_count):
                        yq, yk = _rotary.rotary_qk_cuda(q, k, cos, sin)  # noqa: B023
                        return _rotary.rotary_qk_cuda(gq, gk, cos, sin, sign=-1) if bwd else (yq, yk)  # noqa: B023
                calls[v] = ours
        if args.profile:
            out["profile"] = _profile(calls, variants, bwd, args.runs, shape)
            break
        with torch.no_grad():
            ref = calls["shipped"]() if "shipped" in calls else None
            for v in variants:
                if v not in PEERS and ref is not None:
                    got = calls[v]()
                    err = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref))
                    tol = (4 * torch.finfo(dt).eps * max(b.float().abs().max().item() for b in ref)
                           if v in LEAN or "l" in settings[v] else 0)  # another kernel: to 4 ulp
                    if err > tol:
                        raise SystemExit(f"diag_rotary: {v} {shape} differs from shipped by {err}")
        per = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                grad = torch.enable_grad() if v in AUTOGRAD and bwd else torch.no_grad()
                with grad:
                    per[v].append(ops.benchmark(calls[v], bytes_moved=moved, runs=args.runs, warmup=3).median_ms)
        us = {v: statistics.median(ms) * 1e3 for v, ms in per.items()}
        base = "compile" if "compile" in us else "shipped"
        case = {"rows": rows, "cols": cols, "ballast_mib": ballast, "us": us, "rounds_ms": per,
                "gbps": {v: moved / (t * 1e-6) / 1e9 for v, t in us.items()}}
        out["cases"].append(case)
        cells = [f"{v} {t:7.2f} us {case['gbps'][v]:5.0f} ({us[base] / t:.3f}x)" for v, t in us.items()]
        pre = "" if ballast is None else f"ballast {ballast:5d} MiB "
        print(f"{pre}{rows:6d}x{cols:<6d} " + " | ".join(cells), flush=True)
        del q, k, gq, gk, calls, pad
        torch.cuda.empty_cache()  # the next case allocates afresh
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
