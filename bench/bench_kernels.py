"""NVRTC kernels: opsmith beside the anchors (CuPy, Triton, torch load_inline and _compile_kernel,
cuda.core, a naive cuda-bindings launch), from one run, each phase in a fresh process.

    python3 bench/bench_kernels.py [--out results.json] [--skip-torch-ext] [--repeat 2]

Phases (each its own process, so that imports and caches are honest):
  cold    source to the first finished launch, empty cache. Reported as compile (source to a
          loaded-or-loadable kernel) + first launch (module load, launch, synchronize), with the
          CUDA context already created by torch for every tool (the context costs the same to all).
  warm    a fresh process with a filled cache, after ``import torch``: (a) torch's CUDA already
          initialised, (b) CUDA untouched and the arch given by OPSMITH_CUDA_ARCH, (c) CUDA
          untouched and the arch read from the device.
  launch  per-call overhead from Python for a 1-element tensor: 20000 calls, then synchronize
          (the anchors' method); the C launcher and the Python one side by side.
  cpu_launch  (only with --phase; no GPU) the C launcher against the Python one on a C no-op.
  bw      ReLU over 1 GiB of fp32 (2^28 elements) against a device-to-device copy of the same
          bytes, median of triton.testing.do_bench.
Writes the JSON to --out, else $OUT/bench_kernels.json, else bench/results/; prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N_CALLS = 20000

RAW = r"""
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
"""
RELU_CU = r"""
#include <torch/extension.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


def bench_call(fn, n=N_CALLS):
    import torch
    for _ in range(500):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def gbps(fn, nbytes):
    import triton.testing
    ms = triton.testing.do_bench(fn, warmup=50, rep=400, return_mode="median")
    return nbytes / (ms * 1e-3) / 1e9


def emit(d):
    print("RESULT", json.dumps(d), flush=True)


# -- ours -------------------------------------------------------------------------------------
def phase_ours_cold():
    import torch
    torch.cuda.init()
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    import opsmith
    k = opsmith.cuda_kernel(RAW, "relu_kernel")
    t1 = time.perf_counter()
    k.launch_n(x.numel(), x, y, x.numel())
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    from opsmith._build import _nvrtc
    emit({"compile_s": t1 - t0, "first_launch_s": t2 - t1, "total_s": t2 - t0,
          "nvrtc_compiles": _nvrtc.nvrtc_stats["compiles"], "correct": bool(torch.equal(y, torch.relu(x)))})


def phase_ours_warm():
    import torch
    mode = os.environ["WARM_MODE"]
    if mode == "cuda_ready":
        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    import opsmith
    opsmith.CudaModule  # noqa: B018  (imports the kernel modules)
    ti = time.perf_counter()
    k = opsmith.cuda_kernel(RAW, "relu_kernel")
    t1 = time.perf_counter()
    import sys
    from opsmith._build import _nvrtc
    nvrtc_used = _nvrtc.nvrtc_stats["library_loads"] > 0 or "cuda.bindings.nvrtc" in sys.modules
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    k.launch_n(x.numel(), x, y, x.numel())
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    from opsmith._build import _nvrtc
    emit({"mode": mode, "import_s": ti - t0, "load_s": t1 - ti, "import_and_load_s": t1 - t0,
          "first_launch_s": t3 - t2,
          "nvrtc_compiles": _nvrtc.nvrtc_stats["compiles"], "nvrtc_loaded_or_imported": nvrtc_used,
          "correct": bool(torch.equal(y, torch.relu(x)))})


def phase_ours_launch():
    import ctypes
    import torch
    import opsmith
    from cuda.bindings import driver as cu
    k = opsmith.cuda_kernel(RAW, "relu_kernel")
    small = torch.randn(1, device="cuda")
    sy = torch.empty_like(small)
    cfg = opsmith.LaunchConfig(1, 256)
    out = {}
    out["c_launcher"] = k._claunch is not None  # opsmith._runtime._claunch built and OPSMITH_C_LAUNCH on
    out["call_us_launch_config"] = bench_call(lambda: k.launch(cfg, small, sy, 1))
    py_launch = k._py_launch  # the generated Python launcher (the C one's fallback)
    out["call_us_launch_config_python"] = bench_call(lambda: py_launch(cfg, small, sy, 1))
    out["call_us_cupy_style"] = bench_call(lambda: k((1,), (256,), (small, sy, 1)))
    out["call_us_launch_n"] = bench_call(lambda: k.launch_n(1, small, sy, 1))
    launch = k.launch
    t = time.perf_counter()  # the bound function without a lambda around it
    for _ in range(N_CALLS):
        launch(cfg, small, sy, 1)
    torch.cuda.synchronize()
    out["call_us_launch_direct_loop"] = (time.perf_counter() - t) / N_CALLS * 1e6
    t = time.perf_counter()
    for _ in range(N_CALLS):
        py_launch(cfg, small, sy, 1)
    torch.cuda.synchronize()
    out["call_us_launch_direct_loop_python"] = (time.perf_counter() - t) / N_CALLS * 1e6
    # calls the C launcher handed to Python (1 expected: the first launch, which loads the module)
    out["c_fallbacks"] = getattr(launch, "fallbacks", None)
    # the same pre-packed launch through other routes (which is fastest?)
    from opsmith._runtime import _driver
    st = k._states[0]
    ns = k._namespaces[0]
    params = ns["params"].value
    slots = [ns["S0"], ns["S1"], ns["S2"]]
    getraw = torch._C._cuda_getCurrentRawStream
    fn_obj = cu.CUfunction(st.fn)

    def via_bindings():
        slots[0].value = small.data_ptr()
        slots[1].value = sy.data_ptr()
        slots[2].value = 1
        return cu.cuLaunchKernel(fn_obj, 1, 1, 1, 256, 1, 1, 0, getraw(0), params, 0)
    out["call_us_prepacked_cuda_bindings"] = bench_call(via_bindings)
    raw = _driver.raw_launch()
    out["call_us_raw_ctypes_cuLaunchKernel_no_checks"] = bench_call(
        lambda: raw(st.fn, 1, 1, 1, 256, 1, 1, 0, getraw(0), params, None))
    ex = _driver.launch_ex()
    c = cfg._ex[getraw(0)]
    pp = ns["params"]
    out["call_us_raw_cuLaunchKernelEx_no_checks"] = bench_call(lambda: ex(c, st.fnp, pp, None))

    def naive():  # the anchor's naive cuda-bindings launch (gpu_floor.py)
        args = ((small.data_ptr(), sy.data_ptr(), 1), (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong))
        return cu.cuLaunchKernel(st.fn, 1, 1, 1, 256, 1, 1, 0, torch.cuda.current_stream().cuda_stream, args, 0)
    out["call_us_naive_cuda_bindings"] = bench_call(naive)
    out["call_us_torch_relu"] = bench_call(lambda: torch.relu(small))
    out["call_us_torch_empty_like"] = bench_call(lambda: torch.empty_like(small))
    torch.cuda.synchronize()
    emit(out)


def phase_cpu_launch():
    """No GPU: the C launcher against the Python one, both on a C no-op as the driver.

    CPU tensors report device -1, so both launchers are told that -1 is torch's current
    device; the Python launcher's ``if dev < 0: fail_device(...)`` line then calls ``slice``
    (a cheap builtin no-op, timed alone as ``call_us_slice_builtin``) instead of raising.
        python bench/bench_kernels.py --phase cpu_launch
    """
    import ctypes
    import timeit
    import torch
    import opsmith
    from opsmith._runtime import _claunch
    from opsmith._runtime._launch_config import KernelAttributes
    from opsmith._torch._kernel import _DeviceState
    k = opsmith.cuda_kernel(RAW, "relu_kernel", arch="sm_90")
    x, y = torch.randn(1), torch.empty(1)
    cfg = opsmith.LaunchConfig(1, 256)
    getdev, rawstream = (-1).__int__, abs  # C builtins, like torch._C's
    noop = ctypes.CDLL(_claunch.__file__).opsmith_claunch_noop  # untyped, as _driver.launch_ex()
    noop.restype = ctypes.c_int
    c = k._c_launcher(getdev=getdev, rawstream=rawstream)
    c.set_launch(_claunch.noop_address())
    c.set_function(-1, 1)
    c.set_config(-1, cfg)
    attrs = KernelAttributes(registers=8, static_shared_bytes=0, max_dynamic_shared_bytes=0, local_bytes=0,
                             const_bytes=0, max_threads_per_block=1024, ptx_version=90, binary_version=90)
    st = _DeviceState(1, attrs, 0)
    st.ok[id(cfg)] = cfg
    k._states[-1] = st
    ns = k._namespaces[0]
    ns.update(getdev=getdev, rawstream=rawstream, launch_ex=noop, fail_device=slice)
    py = k._py_launch
    c(cfg, x, y, 1)
    py(cfg, x, y, 1)
    assert c.fallbacks == 0

    def per_call(stmt, env, number=200_000):
        return min(timeit.repeat(stmt, globals=env, number=number, repeat=7)) / number * 1e6
    env = {"c": c, "py": py, "cfg": cfg, "x": x, "y": y, "noop": noop,
           "p": ctypes.c_void_p(1), "q": ctypes.c_void_p(2)}
    out = {"call_us_c_launcher": per_call("c(cfg, x, y, 1)", env),
           "call_us_python_launcher": per_call("py(cfg, x, y, 1)", env),
           "call_us_slice_builtin": per_call("slice(0, x, -1)", env),
           "call_us_ctypes_noop_4_void_p": per_call("noop(p, q, p, None)", env),
           "call_us_tensor_data_ptr": per_call("x.data_ptr()", env),
           "c_fallbacks": c.fallbacks}
    emit(out)


def phase_ours_bw():
    import torch
    import opsmith
    n = 1 << 28
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    vec = opsmith.cuda_kernel(ROOT / "examples" / "relu_kernel.cu", "relu_f32x4")
    scalar = opsmith.cuda_kernel(RAW, "relu_kernel")
    vcfg = vec.config_for(n, items_per_thread=4)
    vec.launch(vcfg, x, y, n)
    torch.cuda.synchronize()
    ok = bool(torch.equal(y, torch.relu(x)))
    nbytes = n * 4 * 2
    z = torch.empty_like(x)
    out = {"correct_vec": ok, "block_vec": vcfg.block[0], "attrs_vec": vec.attributes._asdict()}
    out["GBps_copy"] = gbps(lambda: z.copy_(x), nbytes)
    out["GBps_ours_relu_f32x4"] = gbps(lambda: vec.launch(vcfg, x, y, n), nbytes)
    scfg = opsmith.LaunchConfig(-(-n // 256), 256)
    out["GBps_ours_relu_scalar"] = gbps(lambda: scalar.launch(scfg, x, y, n), nbytes)
    out["GBps_torch_relu"] = gbps(lambda: torch.relu(x), nbytes)
    out["GBps_copy_again"] = gbps(lambda: z.copy_(x), nbytes)
    out["pct_of_copy_f32x4"] = 100 * out["GBps_ours_relu_f32x4"] / max(out["GBps_copy"], out["GBps_copy_again"])
    emit(out)


# -- anchors ------------------------------------------------------------------------------------
def phase_cupy():
    import torch
    torch.cuda.init()
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    import cupy
    k = cupy.RawKernel(RAW, "relu_kernel")
    k.compile()
    t1 = time.perf_counter()
    n = x.numel()
    k(((n + 255) // 256,), (256,), (x.data_ptr(), y.data_ptr(), cupy.int64(n)))
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    out = {"compile_s": t1 - t0, "first_launch_s": t2 - t1, "total_s": t2 - t0,
           "correct": bool(torch.equal(y, torch.relu(x)))}
    small = torch.randn(1, device="cuda")
    sy = torch.empty_like(small)
    one = cupy.int64(1)
    out["call_us"] = bench_call(lambda: k((1,), (256,), (small.data_ptr(), sy.data_ptr(), one)))
    emit(out)


def phase_triton():
    import torch
    torch.cuda.init()
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    import triton
    import triton.language as tl

    @triton.jit
    def relu_k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)

    def relu(x, y):
        n = x.numel()
        relu_k[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y
    y = torch.empty_like(x)
    relu(x, y)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    out = {"compile_and_first_launch_s": t1 - t0, "correct": bool(torch.equal(y, torch.relu(x)))}
    small = torch.randn(1, device="cuda")
    sy = torch.empty_like(small)
    out["call_us"] = bench_call(lambda: relu(small, sy))
    if os.environ.get("BW"):
        big = torch.randn(1 << 28, device="cuda")
        by = torch.empty_like(big)
        out["GBps_triton_relu"] = gbps(lambda: relu(big, by), big.numel() * 8)
    emit(out)


def phase_torch_compile_kernel():
    import torch
    fn = getattr(torch.cuda, "_compile_kernel", None)
    if fn is None:
        emit({"available": False})
        return
    torch.cuda.init()
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    k = fn(RAW, "relu_kernel")
    t1 = time.perf_counter()
    n = x.numel()
    k(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, n])
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    out = {"available": True, "compile_s": t1 - t0, "first_launch_s": t2 - t1, "total_s": t2 - t0,
           "correct": bool(torch.equal(y, torch.relu(x)))}
    small = torch.randn(1, device="cuda")
    sy = torch.empty_like(small)
    out["call_us"] = bench_call(lambda: k(grid=(1, 1, 1), block=(256, 1, 1), args=[small, sy, 1]))
    emit(out)


def phase_cuda_core():
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")
    t0 = time.perf_counter()
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
    dev = Device()
    dev.set_current()
    arch = "".join(str(v) for v in dev.compute_capability)
    prog = Program(RAW, code_type="c++", options=ProgramOptions(arch=f"sm_{arch}", std="c++17"))
    k = prog.compile("cubin").get_kernel("relu_kernel")
    t1 = time.perf_counter()
    out = {"compile_s": t1 - t0}
    try:
        import numpy as np
        small = torch.randn(1, device="cuda")
        sy = torch.empty_like(small)
        s = dev.create_stream(torch.cuda.current_stream())
        cfg = LaunchConfig(grid=1, block=256)
        out["call_us"] = bench_call(lambda: launch(s, cfg, k, small.data_ptr(), sy.data_ptr(), np.int64(1)))
    except Exception as exc:  # report, do not fail the whole benchmark
        out["call_error"] = repr(exc)[:300]
    emit(out)


def phase_torch_ext():
    import torch
    from torch.utils.cpp_extension import load_inline
    t0 = time.perf_counter()
    m = load_inline("relu_ext_bench", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                    cuda_sources=RELU_CU, functions=["relu"], extra_cuda_cflags=["-O3"])
    t1 = time.perf_counter()
    x = torch.randn(1 << 20, device="cuda")
    y = m.relu(x)
    torch.cuda.synchronize()
    out = {"load_inline_s": t1 - t0, "total_s": time.perf_counter() - t0,
           "correct": bool(torch.equal(y, torch.relu(x)))}
    small = torch.randn(1, device="cuda")
    out["call_us"] = bench_call(lambda: m.relu(small))
    emit(out)


# -- driver -------------------------------------------------------------------------------------
def run(phase, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    t = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--phase", phase], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    res = None
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    if res is None:
        res = {"error": (p.stdout + p.stderr)[-3000:]}
    res["process_wall_s"] = wall
    print(phase, json.dumps(res)[:500], flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase")
    ap.add_argument("--out")
    ap.add_argument("--skip-torch-ext", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    if a.phase:
        globals()["phase_" + a.phase]()
        return
    import torch
    res = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        from cuda.bindings import nvrtc, driver
        res["nvrtc"] = ".".join(map(str, nvrtc.nvrtcVersion()[1:]))
        driver.cuInit(0)
        res["driver_cuda"] = driver.cuDriverGetVersion()[1]
        import cuda.bindings
        res["cuda_bindings"] = cuda.bindings.__version__
    except Exception as exc:
        res["versions_error"] = repr(exc)
    base = Path(tempfile.mkdtemp(prefix="bench-kernels-"))
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    for i in range(a.repeat):
        cache = str(base / f"ours{i}")
        res[f"ours_cold{i}"] = run("ours_cold", {"OPSMITH_CACHE_DIR": cache})
        for mode in ("cuda_ready", "fixed_arch", "device_arch"):
            extra = {"OPSMITH_CACHE_DIR": cache, "WARM_MODE": mode}
            if mode == "fixed_arch":
                extra["OPSMITH_CUDA_ARCH"] = arch
            res[f"ours_warm_{mode}{i}"] = run("ours_warm", extra)
    res["ours_bw"] = run("ours_bw", {"OPSMITH_CACHE_DIR": str(base / "ours0")})
    for i in range(a.repeat):  # launch overhead is noisy: ours and CuPy interleaved, best of N each
        res[f"ours_launch{i}"] = run("ours_launch", {"OPSMITH_CACHE_DIR": str(base / "ours0")})
        res[f"cupy_cold{i}"] = run("cupy", {"CUPY_CACHE_DIR": str(base / f"cupy{i}")})
        res[f"cupy_warm{i}"] = run("cupy", {"CUPY_CACHE_DIR": str(base / f"cupy{i}")})
    res["triton_cold"] = run("triton", {"TRITON_CACHE_DIR": str(base / "triton")})
    res["triton_warm"] = run("triton", {"TRITON_CACHE_DIR": str(base / "triton"), "BW": "1"})
    res["torch_compile_kernel"] = run("torch_compile_kernel")
    res["cuda_core"] = run("cuda_core")
    if not a.skip_torch_ext:
        ext = str(base / "torch_ext")
        res["torch_ext_cold"] = run("torch_ext", {"TORCH_EXTENSIONS_DIR": ext, "MAX_JOBS": "16"})
        res["torch_ext_warm"] = run("torch_ext", {"TORCH_EXTENSIONS_DIR": ext})
    out = a.out or (os.path.join(os.environ["OUT"], "bench_kernels.json") if os.environ.get("OUT")
                    else str(ROOT / "bench" / "results" / "bench_kernels.json"))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print_table(res)
    print("JSON:", out)


def _g(res, key, field):
    v = res.get(key, {}).get(field)
    return v


def print_table(res):
    def best(keys, field):
        vals = [res[k][field] for k in keys if isinstance(res.get(k, {}).get(field), (int, float))]
        return min(vals) if vals else None

    def fmt(v, unit):
        if v is None:
            return "-"
        return {"s": f"{v:.3f} s", "ms": f"{v * 1e3:.2f} ms", "us": f"{v:.2f} us", "%": f"{v:.1f} %",
                "GB/s": f"{v:.0f} GB/s"}[unit]
    rk = [k for k in res if k.startswith("ours_cold")]
    rows = [
        ("cold: source -> first launch (ours)", best(rk, "total_s"), "s"),
        ("cold (CuPy RawKernel)", best([k for k in res if k.startswith("cupy_cold")], "total_s"), "s"),
        ("cold (torch._compile_kernel)", _g(res, "torch_compile_kernel", "total_s"), "s"),
        ("cold (cuda.core compile only)", _g(res, "cuda_core", "compile_s"), "s"),
        ("cold (Triton)", _g(res, "triton_cold", "compile_and_first_launch_s"), "s"),
        ("cold (torch load_inline)", _g(res, "torch_ext_cold", "total_s"), "s"),
        ("warm load, torch CUDA ready (ours)", best([k for k in res if k.startswith("ours_warm_cuda_ready")], "load_s"), "ms"),
        ("  + import opsmith (ours)", best([k for k in res if k.startswith("ours_warm_cuda_ready")], "import_s"), "ms"),
        ("warm load, arch fixed, CUDA untouched (ours)", best([k for k in res if k.startswith("ours_warm_fixed_arch")], "load_s"), "ms"),
        ("warm load, arch from device, CUDA untouched (ours)", best([k for k in res if k.startswith("ours_warm_device_arch")], "load_s"), "ms"),
        ("warm first launch incl. module load (ours)", best([k for k in res if k.startswith("ours_warm_cuda_ready")], "first_launch_s"), "ms"),
        ("warm (CuPy compile())", best([k for k in res if k.startswith("cupy_warm")], "compile_s"), "ms"),
        ("warm (Triton compile + first launch)", _g(res, "triton_warm", "compile_and_first_launch_s"), "ms"),
        ("warm (torch load_inline)", _g(res, "torch_ext_warm", "load_inline_s"), "ms"),
        ("launch, LaunchConfig (ours)", best([k for k in res if k.startswith("ours_launch")], "call_us_launch_config"), "us"),
        ("launch, kernel(grid, block, args) (ours)", best([k for k in res if k.startswith("ours_launch")], "call_us_cupy_style"), "us"),
        ("launch, launch_n (ours)", best([k for k in res if k.startswith("ours_launch")], "call_us_launch_n"), "us"),
        ("launch, pre-packed via cuda-bindings", best([k for k in res if k.startswith("ours_launch")], "call_us_prepacked_cuda_bindings"), "us"),
        ("launch, raw ctypes cuLaunchKernel, no checks", best([k for k in res if k.startswith("ours_launch")], "call_us_raw_ctypes_cuLaunchKernel_no_checks"), "us"),
        ("launch, raw ctypes cuLaunchKernelEx, no checks", best([k for k in res if k.startswith("ours_launch")], "call_us_raw_cuLaunchKernelEx_no_checks"), "us"),
        ("launch (naive cuda-bindings)", best([k for k in res if k.startswith("ours_launch")], "call_us_naive_cuda_bindings"), "us"),
        ("launch (CuPy RawKernel)", best([k for k in res if k.startswith("cupy_")], "call_us"), "us"),
        ("launch (torch._compile_kernel)", _g(res, "torch_compile_kernel", "call_us"), "us"),
        ("launch (cuda.core)", _g(res, "cuda_core", "call_us"), "us"),
        ("launch (Triton)", _g(res, "triton_warm", "call_us"), "us"),
        ("launch (torch.relu)", best([k for k in res if k.startswith("ours_launch")], "call_us_torch_relu"), "us"),
        ("launch, LaunchConfig, Python launcher (ours)", best([k for k in res if k.startswith("ours_launch")], "call_us_launch_config_python"), "us"),
        ("launch, direct loop, C launcher (ours)", best([k for k in res if k.startswith("ours_launch")], "call_us_launch_direct_loop"), "us"),
        ("launch, direct loop, Python launcher (ours)", best([k for k in res if k.startswith("ours_launch")], "call_us_launch_direct_loop_python"), "us"),
        ("1 GiB ReLU f32x4 (ours)", _g(res, "ours_bw", "GBps_ours_relu_f32x4"), "GB/s"),
        ("1 GiB device copy", _g(res, "ours_bw", "GBps_copy"), "GB/s"),
        ("1 GiB ReLU scalar kernel (ours)", _g(res, "ours_bw", "GBps_ours_relu_scalar"), "GB/s"),
        ("1 GiB torch.relu", _g(res, "ours_bw", "GBps_torch_relu"), "GB/s"),
        ("1 GiB Triton ReLU", _g(res, "triton_warm", "GBps_triton_relu"), "GB/s"),
        ("ReLU f32x4 as % of copy (ours)", _g(res, "ours_bw", "pct_of_copy_f32x4"), "%"),
    ]
    print()
    print(f"{'measure':52s} {'value':>12s}")
    for name, v, unit in rows:
        print(f"{name:52s} {fmt(v, unit):>12s}")
    vals = {name: v for name, v, _ in rows}

    def ratio(a, b):
        x, y = vals.get(a), vals.get(b)
        return f"{y / x:.1f}x" if x and y else "-"
    print(f"ratios (anchor / ours): cold vs CuPy {ratio(rows[0][0], rows[1][0])}, "
          f"cold vs torch load_inline {ratio(rows[0][0], rows[5][0])}, "
          f"warm vs CuPy {ratio(rows[6][0], rows[11][0])}, "
          f"launch vs CuPy {ratio(rows[14][0], rows[21][0])}, "
          f"launch vs Triton {ratio(rows[14][0], rows[24][0])}; "
          f"ReLU f32x4 = {fmt(vals[rows[-1][0]], '%')} of copy bandwidth")


if __name__ == "__main__":
    main()
