"""The CUDA driver, lazily: torch's primary contexts, modules from cubin bytes, the raw launch.

Nothing here runs at import. The first call that needs the GPU imports
``cuda.bindings.driver`` and uses the *primary* context of the device that torch uses
(``cuDevicePrimaryCtxRetain``), so kernels, torch tensors and torch streams share one
context per device. Loading a module pushes that context, loads and pops it again: torch's
current device is never changed.

The hot path (``cuLaunchKernel``) goes through ctypes into libcuda with a pre-built
``void**`` argument array; every other call goes through cuda-bindings for its error
handling. ``bench/bench_kernels.py`` measures both launch routes.
"""
from __future__ import annotations

import ctypes
import importlib
import threading
from typing import Any

from ._errors import LaunchError, ToolchainError
from ._nvrtc import INSTALL_HINT

__all__ = ["driver", "check", "error_name", "primary_context", "pushed_context", "load_module",
           "get_function", "raw_launch", "driver_version", "device_attribute", "device_arch",
           "CUDA_ERROR_INVALID_CONTEXT"]

CUDA_ERROR_INVALID_CONTEXT = 201
_UNSUPPORTED_PTX = 222
_NO_BINARY = 209
_INVALID_PTX = 218

_lock = threading.RLock()
_drv: Any = None
_contexts: dict[int, Any] = {}
_raw_launch = None


def driver():
    """``cuda.bindings.driver`` after ``cuInit``; a ToolchainError naming the package if missing."""
    global _drv
    if _drv is not None:
        return _drv
    try:
        cu = importlib.import_module("cuda.bindings.driver")
    except ImportError as exc:
        raise ToolchainError(f"launching CUDA kernels needs cuda-bindings, which is not importable "
                             f"({exc}). Install it: {INSTALL_HINT}") from None
    try:
        (err,) = cu.cuInit(0)
    except Exception as exc:  # cuda-pathfinder raises its own error when libcuda is absent
        raise ToolchainError(f"the NVIDIA driver library (libcuda) could not be loaded: {exc}. "
                             f"Kernels compile without a GPU, but launching needs an NVIDIA GPU "
                             f"and its driver.") from None
    if int(err) != 0:
        raise ToolchainError(f"the CUDA driver could not be initialised ({error_name(err, cu)}). "
                             f"Check that an NVIDIA GPU and its driver are present (nvidia-smi).")
    _drv = cu
    return cu


def error_name(err, cu=None) -> str:
    cu = cu or _drv
    try:
        _, name = cu.cuGetErrorName(cu.CUresult(int(err)))
        _, text = cu.cuGetErrorString(cu.CUresult(int(err)))
        return f"{name.decode()} ({int(err)}): {text.decode()}"
    except Exception:  # an unknown code still deserves a message
        return f"CUresult {int(err)}"


def check(result, what: str) -> None:
    if int(result) != 0:
        raise LaunchError(f"{what} failed: {error_name(result, driver())}")


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, e.g. (13, 0)."""
    cu = driver()
    err, v = cu.cuDriverGetVersion()
    check(err, "cuDriverGetVersion")
    return v // 1000, (v % 1000) // 10


def primary_context(device: int):
    """The primary context of ``device`` (the one torch uses), retained once per process."""
    ctx = _contexts.get(device)
    if ctx is not None:
        return ctx
    with _lock:
        cu = driver()
        err, dev = cu.cuDeviceGet(device)
        check(err, f"cuDeviceGet({device})")
        err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
        check(err, f"cuDevicePrimaryCtxRetain({device})")
        _contexts[device] = ctx
        return ctx


class pushed_context:
    """``with pushed_context(dev):`` makes ``dev``'s primary context current, then restores."""

    def __init__(self, device: int) -> None:
        self.device = device

    def __enter__(self):
        cu = driver()
        check(cu.cuCtxPushCurrent(primary_context(self.device))[0], "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc) -> None:
        _drv.cuCtxPopCurrent()


def device_attribute(device: int, name: str) -> int:
    cu = driver()
    err, dev = cu.cuDeviceGet(device)
    check(err, f"cuDeviceGet({device})")
    err, value = cu.cuDeviceGetAttribute(getattr(cu.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + name), dev)
    check(err, f"cuDeviceGetAttribute({name})")
    return int(value)


def device_arch(device: int) -> str:
    """``"sm_90"`` for an H100: the real arch of ``device`` (no context is created)."""
    major = device_attribute(device, "COMPUTE_CAPABILITY_MAJOR")
    minor = device_attribute(device, "COMPUTE_CAPABILITY_MINOR")
    return f"sm_{major}{minor}"


def load_module(code: bytes, device: int, *, kind: str, arch: str, nvrtc_version: str, name: str):
    """Load a cubin or PTX into ``device``'s primary context; explain the usual failures."""
    cu = driver()
    data = code if kind == "cubin" or code.endswith(b"\0") else code + b"\0"
    with pushed_context(device):
        err, module = cu.cuModuleLoadData(data)
    code_ = int(err)
    if code_ == 0:
        return module
    if code_ in (_UNSUPPORTED_PTX, _INVALID_PTX) and kind == "ptx":
        major, minor = driver_version()
        raise LaunchError(
            f"the driver cannot JIT the PTX of {name}: it was made by NVRTC {nvrtc_version}, and "
            f"this driver supports CUDA {major}.{minor} ({error_name(err, cu)}). PTX from an NVRTC "
            f"newer than the driver fails to load. Compile to a cubin instead (output='cubin', "
            f"the default), or install an NVRTC no newer than CUDA {major}.{minor} "
            f"(pip install 'nvidia-cuda-nvrtc=={major}.{minor}.*'), or update the driver.")
    if code_ == _NO_BINARY:
        dev_arch = device_arch(device)
        raise LaunchError(
            f"{name} was compiled for {arch} but cuda:{device} is {dev_arch} ({error_name(err, cu)}). "
            f"Pass arch={dev_arch!r} or unset OPSMITH_CUDA_ARCH so that the device's arch is used.")
    raise LaunchError(f"cuModuleLoadData for {name} on cuda:{device} failed: {error_name(err, cu)}")


def get_function(module, lowered: str, display: str):
    cu = driver()
    err, fn = cu.cuModuleGetFunction(module, lowered.encode())
    if int(err) != 0:
        raise LaunchError(f"kernel {display!r} (symbol {lowered}) is not in the module: "
                          f"{error_name(err, cu)}")
    return fn


def raw_launch():
    """libcuda's ``cuLaunchKernel`` through ctypes, typed once (the hot path)."""
    global _raw_launch
    if _raw_launch is None:
        driver()  # cuInit, and a clear error when cuda-bindings is missing
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernel
        u = ctypes.c_uint
        fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _raw_launch = fn
    return _raw_launch
