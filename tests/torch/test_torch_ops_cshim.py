"""The C-shim path of opsmith.custom_op without a GPU.

The library (opsmith/_torch/_cshim_source.py) is built with the real compiler and registered
through this torch's real ``aoti_torch_library_impl`` for the CPU key; only the launch is a
stand-in: a ctypes callback with ``cuLaunchKernel``'s signature that runs the ReLU over the
pointers the C kernel packed. Everything else (the stack, the checks, the allocation of the
output, the contiguous copy, the kernel chosen by dtype, the grid, the error path) is the code
that runs on a GPU.
"""
from __future__ import annotations

import ctypes
import itertools
import os

import pytest

torch = pytest.importorskip("torch")

import opsmith  # noqa: E402
from conftest import cache_dir  # noqa: E402
from opsmith._torch import _cshim  # noqa: E402

SRC = r"""
extern "C" __global__ void relu_f32(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" __global__ void relu_f64(const double* x, double* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.0 ? x[i] : 0.0;
}
extern "C" __global__ void add_i32(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void scale(const float* x, float alpha, float* y, int n) {}
extern "C" __global__ void shift(const double* x, long long k, bool neg, double* y, long long n) {}
extern "C" __global__ void widen(const float* x, double* y, long long n) {}
"""
_ids = itertools.count()
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                           ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
FN_RELU32, FN_RELU64, FN_ADD, FN_SCALE, FN_SHIFT, FN_WIDEN = 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000
launches: list[tuple] = []


def _fake_launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
    """Runs the kernel the C code asked for over the pointers it packed (one 'thread' per item)."""
    def ptr(i, ctype):
        return ctypes.cast(ctypes.cast(params[i], ctypes.POINTER(ctypes.c_void_p))[0], ctypes.POINTER(ctype))
    if fn in (FN_RELU32, FN_RELU64):
        ct = ctypes.c_float if fn == FN_RELU32 else ctypes.c_double
        n = ctypes.cast(params[2], ctypes.POINTER(ctypes.c_longlong))[0]
        x, y = ptr(0, ct), ptr(1, ct)
        for i in range(n):
            y[i] = max(x[i], 0.0)
    elif fn == FN_ADD:
        n = ctypes.cast(params[3], ctypes.POINTER(ctypes.c_int))[0]
        a, b, out = ptr(0, ctypes.c_float), ptr(1, ctypes.c_float), ptr(2, ctypes.c_float)
        for i in range(n):
            out[i] = a[i] + b[i]
    elif fn == FN_SCALE:  # (x, float alpha, y, int n)
        alpha = ctypes.cast(params[1], ctypes.POINTER(ctypes.c_float))[0]
        n = ctypes.cast(params[3], ctypes.POINTER(ctypes.c_int))[0]
        x, y = ptr(0, ctypes.c_float), ptr(2, ctypes.c_float)
        for i in range(n):
            y[i] = alpha * x[i]
    elif fn == FN_SHIFT:  # (x, long long k, bool neg, y, long long n)
        k = ctypes.cast(params[1], ctypes.POINTER(ctypes.c_longlong))[0]
        neg = ctypes.cast(params[2], ctypes.POINTER(ctypes.c_bool))[0]
        n = ctypes.cast(params[4], ctypes.POINTER(ctypes.c_longlong))[0]
        x, y = ptr(0, ctypes.c_double), ptr(3, ctypes.c_double)
        for i in range(n):
            y[i] = (-x[i] if neg else x[i]) + k
    elif fn == FN_WIDEN:  # (const float* x, double* y, long long n)
        n = ctypes.cast(params[2], ctypes.POINTER(ctypes.c_longlong))[0]
        x, y = ptr(0, ctypes.c_float), ptr(1, ctypes.c_double)
        for i in range(n):
            y[i] = x[i]
    else:
        return 400  # CUDA_ERROR_INVALID_HANDLE
    launches.append((fn, (gx, gy, gz), (bx, by, bz), smem, stream, n))
    return 0


_launch_cb = _LAUNCH(_fake_launch)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    pytest.importorskip("cuda.bindings")
    with cache_dir(tmp_path_factory.mktemp("nvrtc-cache")):
        mod = opsmith.CudaModule(SRC, arch="sm_90")
        return {n: mod.get_kernel(n) for n in ("relu_f32", "relu_f64", "add_i32", "scale", "shift", "widen")}


@pytest.fixture
def cpu_lib(monkeypatch, tmp_path):
    """A copy of the library of its own, initialised with the stand-in launch; the ops made
    with it keep Python CUDA implementations (on a GPU machine too)."""
    import shutil
    if not _cshim.available(cuda=False):
        pytest.skip(f"torch {torch.__version__} exports no aoti_torch_library_impl (torch >= 2.8 does)")
    monkeypatch.setenv("OPSMITH_TORCH_OP_CSHIM", "0")
    copy = tmp_path / "opsmith_cshim_cpu_test.so"  # another file: never the process's own library
    shutil.copyfile(_cshim.build(), copy)
    return _cshim.load(str(copy), launch=_launch_cb)


def _op(kernels, lib, names, schema=None, fail=None, **kw):
    """A kernel op whose CPU key is served by the C kernel with the stand-in launch."""
    ks = [kernels[n] for n in names]
    op = opsmith.custom_op(f"opsmith_cshim{os.getpid()}::op_{next(_ids)}", schema, kernel=ks, **kw)
    fns = {"relu_f32": FN_RELU32, "relu_f64": FN_RELU64, "add_i32": FN_ADD, "scale": FN_SCALE,
           "shift": FN_SHIFT, "widen": FN_WIDEN}

    def prepare(kernel: int, device: int):
        if fail:
            raise RuntimeError(fail)
        return fns[names[kernel]], 128, None
    assert _cshim.fits(op, ks, op._binding, kw.get("launch")) is None
    _cshim.register(op, ks, op._binding, key="CPU", prepare=prepare, lib=lib)
    return op


def test_source_compiles_and_library_exports(cpu_lib):
    for name in ("osm_init", "osm_describe", "osm_set_function", "osm_register", "osm_set_error"):
        assert hasattr(cpu_lib, name)
    assert cpu_lib.osm_abi() == 2 and cpu_lib.osm_max_ops() >= 16


def test_cpu_kernel_through_the_shim_matches_eager(kernels, cpu_lib):
    relu = _op(kernels, cpu_lib, ["relu_f32", "relu_f64"])
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(1000, dtype=dtype)
        launches.clear()
        y = relu(x)
        assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
        assert torch.equal(y, torch.relu(x))
        fn, grid, block, smem, stream, n = launches[0]
        assert fn == (FN_RELU32 if dtype == torch.float32 else FN_RELU64)
        assert grid == (8, 1, 1) and block == (128, 1, 1) and n == 1000 and stream is None


def test_non_contiguous_and_empty_inputs(kernels, cpu_lib):
    relu = _op(kernels, cpu_lib, ["relu_f32"])
    x = torch.randn(37, 53).t()
    assert not x.is_contiguous()
    assert torch.equal(relu(x), torch.relu(x))
    launches.clear()
    e = relu(torch.empty(0, 3))
    assert e.shape == (0, 3) and launches == []  # nothing to launch


def test_two_inputs_int_count_and_like(kernels, cpu_lib):
    add = _op(kernels, cpu_lib, ["add_i32"])
    assert add.schema.text == "(Tensor a, Tensor b) -> Tensor"
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    assert torch.allclose(add(a, b), a + b)


def test_errors_are_runtime_errors_with_the_reason(kernels, cpu_lib):
    relu = _op(kernels, cpu_lib, ["relu_f32"])
    with pytest.raises(RuntimeError, match=r"no kernel takes inputs of dtype float64"):
        relu(torch.randn(3, dtype=torch.float64))
    broken = _op(kernels, cpu_lib, ["relu_f32"], fail="the module does not load here")
    with pytest.raises(RuntimeError, match="the module does not load here"):
        broken(torch.randn(3))
    # no handle leaks or double frees: the op still works many times after errors
    for _ in range(200):
        assert relu(torch.ones(2)).sum().item() == 2


def test_opcheck_on_cpu(kernels, cpu_lib):
    relu = _op(kernels, cpu_lib, ["relu_f32"])
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    assert torch.library.opcheck(relu.default, (torch.randn(4, 3),), test_utils=utils) == \
        {u: "SUCCESS" for u in utils}
    compiled = torch.compile(lambda x: relu(x) * 2, fullgraph=True, backend="eager")
    x = torch.randn(6)
    assert torch.equal(compiled(x), torch.relu(x) * 2)


def test_scalar_arguments_reach_the_kernel_in_its_c_types(kernels, cpu_lib):
    scale = _op(kernels, cpu_lib, ["scale"])
    assert scale.schema.text == "(Tensor x, float alpha) -> Tensor"
    x = torch.randn(9)
    assert torch.allclose(scale(x, 1.5), 1.5 * x) and torch.allclose(scale(x, -2.0), -2.0 * x)
    shift = _op(kernels, cpu_lib, ["shift"])
    assert shift.schema.text == "(Tensor x, int k, bool neg) -> Tensor"
    x = torch.randn(5, dtype=torch.float64)
    assert torch.equal(shift(x, 3, False), x + 3) and torch.equal(shift(x, -(2 ** 40), True), -x - 2 ** 40)


def test_an_int_that_does_not_fit_the_kernels_int_is_refused(kernels, cpu_lib):
    src = 'extern "C" __global__ void add_k(const float* x, int k, float* y, long long n) {}'
    k = opsmith.CudaModule(src, arch="sm_90").get_kernel("add_k")
    op = opsmith.custom_op(f"opsmith_cshim{os.getpid()}::add_k_{next(_ids)}", kernel=k)
    assert _cshim.fits(op, [k], op._binding, None) is None
    _cshim.register(op, [k], op._binding, key="CPU", prepare=lambda kernel, device: (FN_SCALE, 128, None), lib=cpu_lib)
    with pytest.raises(RuntimeError, match=r"argument 1 = 8589934592 does not fit the kernel's 32-bit int"):
        op(torch.randn(3), 2 ** 33)


def test_out_dtype_and_the_elementwise_rule_run_in_c(kernels, cpu_lib):
    widen = _op(kernels, cpu_lib, ["widen"], out=opsmith.Out(dtype=torch.float64))
    x = torch.randn(7)
    y = widen(x)
    assert y.dtype == torch.float64 and torch.equal(y, x.double())
    relu = _op(kernels, cpu_lib, ["relu_f32", "relu_f64"], launch=opsmith.Elementwise(bytes_per_thread=64))
    for dtype, per_thread in ((torch.float32, 16), (torch.float64, 8)):
        launches.clear()
        x = torch.randn(10000, dtype=dtype)
        assert torch.equal(relu(x), torch.relu(x))
        assert launches[0][1] == (-(-10000 // (128 * per_thread)), 1, 1)  # ceil(n / (block * items))
    with pytest.raises(opsmith.SpecError, match="positive int"):
        opsmith.Elementwise(0)


def test_ops_that_do_not_fit_keep_python(kernels):
    op = opsmith.custom_op(f"opsmith_cshim{os.getpid()}::widen_{next(_ids)}", kernel=kernels["widen"],
                           out=opsmith.Out(dtype=lambda x: torch.float64))
    assert "dtype is a function" in _cshim.fits(op, [kernels["widen"]], op._binding, None)
    relu = opsmith.custom_op(f"opsmith_cshim{os.getpid()}::r_{next(_ids)}", kernel=kernels["relu_f32"],
                             out=opsmith.Out(zeros=True))
    assert "zeros" in _cshim.fits(relu, [kernels["relu_f32"]], relu._binding, None)
    assert "launch rule" in _cshim.fits(relu, [kernels["relu_f32"]], relu._binding, lambda x, o: None)
    assert relu.cshim is False  # a CPU-only torch has no CUDA shim: the Python CUDA implementation


def test_no_driver_keeps_python_and_says_why(kernels, monkeypatch):
    """A CUDA build of torch on a machine with no GPU driver (torch 2.8's and 2.14's wheels on a CPU
    machine): the op must still register, with the Python CUDA implementation; the C kernel's
    library would take the driver's entry points at load and fail the import."""
    from opsmith._errors import ToolchainError
    from opsmith._runtime import _driver

    def missing():
        raise ToolchainError("the NVIDIA driver library libcuda.so.1 could not be loaded")
    monkeypatch.setattr(_driver, "entry_points", missing)
    monkeypatch.setattr(_cshim, "_state", {})  # answers are kept per process: none yet, the real ones restored after
    monkeypatch.setattr(_cshim, "available", lambda cuda=True: True)  # as a CUDA torch >= 2.8 says
    op = opsmith.custom_op(f"opsmith_cshim{os.getpid()}::nodrv_{next(_ids)}", kernel=kernels["relu_f32"])
    assert "no CUDA driver" in _cshim.why_not(op, [kernels["relu_f32"]], op._binding, None)
    assert op.cshim is False and torch._C._dispatch_has_kernel_for_dispatch_key(op.default.name(), "CUDA")


def test_every_slot_runs_its_own_op(kernels, cpu_lib):
    """Slots past the first eight (a boxed table built wrongly sent slot 8 to slot 10's kernel)."""
    n_ops = min(20, cpu_lib.osm_max_ops())
    ops = [_op(kernels, cpu_lib, ["relu_f32"] if i % 2 else ["add_i32"]) for i in range(n_ops)]
    assert len(cpu_lib._opsmith_slots) == n_ops
    a, b = torch.randn(6), torch.randn(6)
    for i, op in enumerate(ops):
        launches.clear()
        if i % 2:
            assert torch.equal(op(a), torch.relu(a)), i
        else:
            assert torch.allclose(op(a, b), a + b), i
        assert launches[0][0] == (FN_RELU32 if i % 2 else FN_ADD)
