"""Per-call cost of an op on a 1-element CUDA tensor: opsmith.custom_op against torch's ways.

Every row runs in this one process on the same tensor, interleaved round by round, and
does the same work where it can (allocate the output, launch the same NVRTC ReLU kernel):

  torch.relu                      the floor: a native op
  pybind function                 a C++ extension function (torch::relu) called directly
  opsmith op (C shim)             opsmith.custom_op from the NVRTC kernel, via OpOverload: the
                                  boxed C kernel registered through torch's C shim (the default
                                  where torch has it; else this row is the Python implementation)
  opsmith op (Python impl)        the same op with OPSMITH_TORCH_OP_CSHIM=0: the generated
                                  Python CUDA implementation
  opsmith op (kernel, autograd)   the same with register_autograd (input needs no grad)
  opsmith op (extension fn)       opsmith.custom_op(cuda=ext.relu)
  Library.define+impl             a Python kernel (empty_like + kernel.launch) by hand
  @custom_op                      torch.library.custom_op with the same body
  kernel.launch (no op)           empty_like + kernel.launch, no dispatcher: the launch itself

and the autograd path, forward + backward (``torch.autograd.grad``), input requiring grad:
ours (backward through a registered op) against ``@custom_op`` + ``register_autograd`` and
torch.relu. Prints a table (microseconds per call, ratio to our op) and writes JSON to --json.

    python bench/bench_op_overhead.py --json results.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

import opsmith

SRC = r"""
extern "C" __global__ void relu_fwd(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" __global__ void relu_bwd(const float* grad, const float* x, float* dx, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) dx[i] = x[i] > 0.f ? grad[i] : 0.f;
}
"""
EXT = "torch::Tensor relu(torch::Tensor x) { return torch::relu(x); }"


def build_rows():
    mod = opsmith.CudaModule(SRC)
    fwd, bwd = mod.get_kernel("relu_fwd"), mod.get_kernel("relu_bwd")
    ext = opsmith.load_inline("bench_op_ext", EXT, functions=["relu"])
    cfg = fwd.config_for(1)
    launch_f, launch_b = fwd.launch, bwd.launch
    empty_like = torch.empty_like

    def py_relu(x):
        y = empty_like(x)
        launch_f(cfg, x, y, x.numel())
        return y

    def py_relu_bwd(g, x):
        dx = empty_like(x)
        launch_b(cfg, g, x, dx, x.numel())
        return dx

    # ours
    ours = opsmith.custom_op("bench_ops::relu", kernel=fwd)
    with opsmith.settings.override(torch_op_cshim=False):
        ours_py = opsmith.custom_op("bench_ops::relu_py", kernel=fwd)
    ours_ag = opsmith.custom_op("bench_ops::relu_ag", "(Tensor x) -> Tensor", kernel=fwd)
    ours_bwd = opsmith.custom_op("bench_ops::relu_bwd", kernel=bwd)
    ours_ag.register_autograd(ours_bwd, save=("x",))
    ours_ext = opsmith.custom_op("bench_ops::relu_ext", cuda=ext.relu)
    # torch.library by hand
    lib = torch.library.Library("bench_lib", "DEF")
    lib.define("relu(Tensor x) -> Tensor")
    lib.impl("relu", py_relu, "CUDA")
    by_hand = torch.ops.bench_lib.relu.default

    # @custom_op, forward only and with register_autograd
    @torch.library.custom_op("bench_co::relu", mutates_args=())
    def co_relu(x: torch.Tensor) -> torch.Tensor:
        return py_relu(x)

    @torch.library.custom_op("bench_co::relu_ag", mutates_args=())
    def co_relu_ag(x: torch.Tensor) -> torch.Tensor:
        return py_relu(x)

    @torch.library.custom_op("bench_co::relu_bwd", mutates_args=())
    def co_relu_bwd(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return py_relu_bwd(g, x)

    def co_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    co_relu_ag.register_autograd(lambda ctx, g: co_relu_bwd(g, ctx.saved_tensors[0]), setup_context=co_setup)
    forward = {
        "torch.relu": torch.relu,
        "pybind function": ext.relu,
        "opsmith op (C shim)": ours.default,
        "opsmith op (Python impl)": ours_py.default,
        "opsmith op (kernel, autograd)": ours_ag.default,
        "opsmith op (extension fn)": ours_ext.default,
        "Library.define+impl": by_hand,
        "@custom_op": co_relu,
        "kernel.launch (no op)": py_relu,
    }
    autograd = {
        "torch.relu": torch.relu,
        "opsmith op (kernel, autograd)": ours_ag.default,
        "@custom_op + register_autograd": co_relu_ag,
    }
    return forward, autograd, (lib,), bool(getattr(ours, "cshim", False))


def per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(rows: dict, make_call, calls: int, rounds: int) -> dict:
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for name, fn in rows.items():
        per_call_us(make_call(fn), 200)  # warm-up: loads, caches, first-call paths
    for _ in range(rounds):  # interleaved: a slow moment of the machine hits every row alike
        for name, fn in rows.items():
            samples[name].append(per_call_us(make_call(fn), calls))
    return {name: {"median_us": statistics.median(s), "min_us": min(s), "samples_us": s}
            for name, s in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    forward, autograd, _keep, cshim = build_rows()
    x = torch.randn(1, device="cuda")
    fwd = measure(forward, lambda fn: (lambda: fn(x)), a.calls, a.rounds)
    xg = torch.randn(1, device="cuda", requires_grad=True)
    g = torch.ones(1, device="cuda")
    grad = torch.autograd.grad
    for fn in autograd.values():  # the same gradient from every row
        if not torch.equal(grad(fn(xg), xg, g)[0], grad(torch.relu(xg), xg, g)[0]):
            raise SystemExit(f"{fn}: wrong gradient")
    bwd = measure(autograd, lambda fn: (lambda: grad(fn(xg), xg, g)), a.calls // 2, a.rounds)
    ours = fwd["opsmith op (C shim)"]["median_us"]
    ours_ag = bwd["opsmith op (kernel, autograd)"]["median_us"]
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "opsmith": opsmith.__version__,
        "python": platform.python_version(), "calls": a.calls, "rounds": a.rounds,
        "c_launcher": opsmith.settings.c_launch, "cshim_registered": cshim, "forward": fwd, "forward_backward": bwd,
        "targets": {
            "ours_le_define_impl": ours <= fwd["Library.define+impl"]["median_us"],
            "custom_op_over_ours": fwd["@custom_op"]["median_us"] / ours,
            "ours_minus_torch_relu_us": ours - fwd["torch.relu"]["median_us"],
        },
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    print(f"\nper call, 1-element float32 CUDA tensor, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"median of {a.rounds} rounds x {a.calls} calls; C shim registered: {cshim}")
    print(f"{'forward':34} {'us/call':>9} {'min':>8} {'/ ours':>8}")
    for name, r in fwd.items():
        print(f"{name:34} {r['median_us']:9.2f} {r['min_us']:8.2f} {r['median_us'] / ours:8.2f}")
    print(f"\n{'forward + backward':34} {'us/call':>9} {'min':>8} {'/ ours':>8}")
    for name, r in bwd.items():
        print(f"{name:34} {r['median_us']:9.2f} {r['min_us']:8.2f} {r['median_us'] / ours_ag:8.2f}")
    t = result["targets"]
    print(f"\ntargets: ours <= define+impl: {t['ours_le_define_impl']}; @custom_op / ours = "
          f"{t['custom_op_over_ours']:.2f} (>= 3); ours - torch.relu = {t['ours_minus_torch_relu_us']:.2f} us "
          f"(aim <= 1.5)")


if __name__ == "__main__":
    main()
