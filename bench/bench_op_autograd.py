"""Per-call cost of differentiable ops on a small CUDA tensor: opsmith against torch (issue 20).

Every row runs in this one process, interleaved round by round (odd rounds in reverse order),
--rounds x --calls; a table shows each row's median, a target the median of the per-round
differences between ours and torch's (a slow spell of the machine hits both sides of a pair):

1. one NVRTC ReLU kernel behind each registration style, 1-element float32 tensor:
   ``torch.relu``; ours (``opsmith.custom_op`` kernel op + ``register_autograd(backward_op,
   save=...)``: C-shim CUDA kernel, native C++ Autograd kernel); the same op with the Python
   Autograd kernel (``OPSMITH_TORCH_OP_NATIVE_AUTOGRAD=0``); ``Library.define`` + a Python impl;
   ``@custom_op``; ``@custom_op`` + ``register_autograd``. Three ways: input not requiring grad,
   input requiring grad (forward only), forward + backward (``torch.autograd.grad``).
2. an op with a float scalar argument (``y = x + alpha``, C shim) against ``torch.add(x, 1.5)``.
3. every ``opsmith.ops`` operator on a (1, 64) float32 tensor against its torch equivalent,
   without and with grad required (forward only): the C++ CUDA kernels of
   ``opsmith/ops/native`` and the native Autograd kernels (``paths.ops_native_cuda``).

Prints the tables with ratios and the issue's targets; writes everything to --json.

    python bench/bench_op_autograd.py --json results.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import opsmith
import opsmith.ops as oo

SRC = r"""
extern "C" __global__ void relu_fwd(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" __global__ void relu_bwd(const float* grad, const float* x, float* dx, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) dx[i] = x[i] > 0.f ? grad[i] : 0.f;
}
extern "C" __global__ void add_scalar(const float* x, float alpha, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + alpha;
}
"""


def build():
    mod = opsmith.CudaModule(SRC)
    fwd, bwd = mod.get_kernel("relu_fwd"), mod.get_kernel("relu_bwd")
    cfg = fwd.config_for(1)
    empty_like = torch.empty_like

    def py_relu(x):
        y = empty_like(x)
        fwd.launch(cfg, x, y, x.numel())
        return y

    def py_relu_bwd(g, x):
        dx = empty_like(x)
        bwd.launch(cfg, g, x, dx, x.numel())
        return dx

    ours = opsmith.custom_op("bench_ag::relu", "(Tensor x) -> Tensor", kernel=fwd)
    ours_b = opsmith.custom_op("bench_ag::relu_bwd", "(Tensor grad, Tensor x) -> Tensor", kernel=bwd)
    ours.register_autograd(ours_b, save=("x",))
    ours_py = opsmith.custom_op("bench_ag::relu_py", "(Tensor x) -> Tensor", kernel=fwd)
    with opsmith.settings.override(torch_op_native_autograd=False):
        ours_py.register_autograd(ours_b, save=("x",))
    add = opsmith.custom_op("bench_ag::add_scalar", kernel=mod.get_kernel("add_scalar"))

    lib = torch.library.Library("bench_ag_lib", "DEF")
    lib.define("relu(Tensor x) -> Tensor")
    lib.impl("relu", py_relu, "CUDA")

    @torch.library.custom_op("bench_ag_co::relu", mutates_args=())
    def co_relu(x: torch.Tensor) -> torch.Tensor:
        return py_relu(x)

    @torch.library.custom_op("bench_ag_co::relu_ag", mutates_args=())
    def co_relu_ag(x: torch.Tensor) -> torch.Tensor:
        return py_relu(x)

    @torch.library.custom_op("bench_ag_co::relu_bwd", mutates_args=())
    def co_relu_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return py_relu_bwd(g, x)

    def co_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    co_relu_ag.register_autograd(lambda ctx, g: co_relu_bwd(g, ctx.saved_tensors[0]), setup_context=co_setup)
    styles = {
        "torch.relu": torch.relu,
        "ours (C shim + native autograd)": ours.default,
        "ours, Python autograd kernel": ours_py.default,
        "Library.define+impl": torch.ops.bench_ag_lib.relu.default,
        "@custom_op": co_relu,
        "@custom_op + register_autograd": co_relu_ag,
    }
    info = {"cshim": bool(ours.cshim), "autograd": ours.autograd, "python_autograd": ours_py.autograd,
            "scalar_cshim": bool(add.cshim)}
    return styles, add.default, info, lib


def per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(calls_by_name: dict, calls: int, rounds: int) -> dict:
    """Each row ``rounds`` times, rows interleaved; odd rounds run the rows in reverse order, so
    that neighbours (ours and torch's) are measured seconds apart, alternately first."""
    for fn in calls_by_name.values():
        per_call_us(fn, 200)  # warm-up: loads, caches, first-call paths
    samples: dict[str, list[float]] = {n: [] for n in calls_by_name}
    order = list(calls_by_name.items())
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            samples[name].append(per_call_us(fn, calls))
    return {n: {"median_us": statistics.median(s), "min_us": min(s), "samples_us": s} for n, s in samples.items()}


def paired(rows: dict, ours: str, theirs: str) -> float:
    """ours - theirs: the median over rounds of the difference within a round (a machine that is
    slow for a while slows both sides of a pair, not the median of one side only)."""
    return statistics.median(a - b for a, b in zip(rows[ours]["samples_us"], rows[theirs]["samples_us"]))


def table(title: str, rows: dict, ref: str) -> None:
    base = rows[ref]["median_us"]
    print(f"\n{title:44} {'us/call':>9} {'min':>8} {'/ ' + ref[:12]:>15}")
    for name, r in rows.items():
        print(f"{name:44} {r['median_us']:9.2f} {r['min_us']:8.2f} {r['median_us'] / base:15.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    styles, add_op, info, _keep = build()
    x = torch.randn(1, device="cuda")
    xg = torch.randn(1, device="cuda", requires_grad=True)
    g = torch.ones(1, device="cuda")
    grad = torch.autograd.grad
    want = grad(torch.relu(xg), xg, g)[0]
    differentiable = {n: f for n, f in styles.items() if n not in ("Library.define+impl", "@custom_op")}
    for name, fn in styles.items():  # the same result (and gradient) from every row
        if not torch.equal(fn(x), torch.relu(x)) or (
                name in differentiable and not torch.equal(grad(fn(xg), xg, g)[0], want)):
            raise SystemExit(f"{name}: wrong result or gradient")
    plain = measure({n: (lambda f=f: f(x)) for n, f in styles.items()}, a.calls, a.rounds)
    rg = measure({n: (lambda f=f: f(xg)) for n, f in differentiable.items()}, a.calls, a.rounds)
    fb = measure({n: (lambda f=f: grad(f(xg), xg, g)) for n, f in differentiable.items()}, a.calls // 2, a.rounds)
    if not torch.equal(add_op(x, 1.5), torch.add(x, 1.5)):
        raise SystemExit("add_scalar: wrong result")
    scalar = measure({"torch.add(x, 1.5)": lambda: torch.add(x, 1.5), "ours: op(x, 1.5), C shim": lambda: add_op(x, 1.5)},
                     a.calls, a.rounds)

    t = torch.randn(1, 64, device="cuda")
    tg = t.clone().requires_grad_(True)
    w = torch.ones(64, device="cuda")
    pairs = {  # opsmith.ops operator -> (ours, torch's)
        "relu": (oo.relu, torch.relu),
        "silu": (oo.silu, F.silu),
        "gelu": (oo.gelu, F.gelu),
        "softmax": (lambda v: oo.softmax(v, -1), lambda v: torch.softmax(v, -1)),
        "rms_norm": (lambda v: oo.rms_norm(v, (64,), w, 1e-6), lambda v: F.rms_norm(v, (64,), w, 1e-6)),
        "layer_norm": (lambda v: oo.layer_norm(v, (64,), w), lambda v: F.layer_norm(v, (64,), w)),
    }
    for name, (ours, theirs) in pairs.items():
        if not torch.allclose(ours(t), theirs(t), atol=1e-5, rtol=1e-5):
            raise SystemExit(f"opsmith.ops.{name}: wrong result")
    info["ops_native_cuda"] = "osm_ops.cpp" in torch._C._dispatch_dump("opsmith::layer_norm")
    ops_rows = {}
    for label, v in (("no grad", t), ("requires grad", tg)):
        calls = {}
        for name, (ours, theirs) in pairs.items():
            calls[f"{name}: opsmith.ops"] = (lambda f=ours: f(v))
            calls[f"{name}: torch"] = (lambda f=theirs: f(v))
        ops_rows[label] = measure(calls, a.calls, a.rounds)

    ours = "ours (C shim + native autograd)"
    targets = {  # paired differences (see paired())
        "no_grad_minus_torch_relu_us": paired(plain, ours, "torch.relu"),
        "requires_grad_minus_torch_relu_us": paired(rg, ours, "torch.relu"),
        "fwd_bwd_minus_torch_relu_us": paired(fb, ours, "torch.relu"),
        "scalar_minus_torch_add_us": paired(scalar, "ours: op(x, 1.5), C shim", "torch.add(x, 1.5)"),
        "ops_minus_torch_us": {label: {n: paired(rows, f"{n}: opsmith.ops", f"{n}: torch") for n in pairs}
                               for label, rows in ops_rows.items()},
    }
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "opsmith": opsmith.__version__,
              "python": platform.python_version(), "calls": a.calls, "rounds": a.rounds, "paths": info,
              "no_grad": plain, "requires_grad": rg, "forward_backward": fb, "scalar": scalar, "ops": ops_rows,
              "targets": targets}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, median of {a.rounds} rounds x {a.calls} "
          f"calls, all rows in one process; paths: {info}")
    table("1-element tensor, input needs no grad", plain, "torch.relu")
    table("input requires grad (forward)", rg, "torch.relu")
    table("forward + backward", fb, "torch.relu")
    table("float scalar argument", scalar, "torch.add(x, 1.5)")
    for label, rows in ops_rows.items():
        table(f"opsmith.ops, (1, 64) float32, {label}", rows, "relu: torch")
    print("\ntargets (us over torch, median of the per-round differences; issue 20 asks <= 1, 2, 3, 1, "
          "and ops <= 1 / 2):")
    for k, v in targets.items():
        if isinstance(v, dict):
            for label, d in v.items():
                print(f"  ops, {label}: " + ", ".join(f"{n} {x:+.2f}" for n, x in d.items()))
        else:
            print(f"  {k}: {v:+.2f}")


if __name__ == "__main__":
    main()
