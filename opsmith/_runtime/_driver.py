"""The CUDA driver, lazily, through ctypes: torch's primary contexts, modules, the raw launch.

Nothing here runs at import. The first call that needs the GPU loads ``libcuda.so.1`` with
ctypes and calls ``cuInit``; modules are loaded into the *primary* context of the device
that torch uses (``cuDevicePrimaryCtxRetain``), so kernels, torch tensors and torch
streams share one context per device. Loading a module pushes that context, loads and
pops it again: torch's current device is never changed.

Why ctypes and not cuda-bindings' driver module: importing ``cuda.bindings.driver`` costs
tens of milliseconds, which alone would break the 5 ms budget of a warm load, and the
launch itself is faster through a typed ctypes function with a pre-built ``void**`` array
(``bench/bench_kernels.py`` measures both). The dozen driver entry points used here have
plain C signatures.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from opsmith._errors import LaunchError, ToolchainError

__all__ = ["driver", "check", "error_name", "primary_context", "pushed_context", "load_module",
           "get_function", "raw_launch", "driver_version", "device_attribute", "device_arch",
           "launch_ex", "func_attribute", "func_set_attribute", "occupancy_block_size",
           "occupancy_active_blocks", "occupancy_active_clusters", "FUNC_ATTRIBUTES", "CUDA_ERROR_INVALID_CONTEXT"]

CUDA_ERROR_INVALID_CONTEXT = 201
_UNSUPPORTED_PTX = 222
_NO_BINARY = 209
_INVALID_PTX = 218
_INVALID_IMAGE = 200

# CUfunction_attribute values (cuda.h)
FUNC_ATTRIBUTES = {"MAX_THREADS_PER_BLOCK": 0, "SHARED_SIZE_BYTES": 1, "CONST_SIZE_BYTES": 2,
                   "LOCAL_SIZE_BYTES": 3, "NUM_REGS": 4, "PTX_VERSION": 5, "BINARY_VERSION": 6,
                   "MAX_DYNAMIC_SHARED_SIZE_BYTES": 8}
# CUdevice_attribute values (cuda.h)
_DEVICE_ATTRIBUTES = {"COMPUTE_CAPABILITY_MAJOR": 75, "COMPUTE_CAPABILITY_MINOR": 76,
                      "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 97, "MULTIPROCESSOR_COUNT": 16}

_lock = threading.RLock()
_lib: Any = None
_contexts: dict[int, int] = {}

_i, _u, _p, _sz = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.c_size_t
_PI, _PP = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES = {
    "cuInit": [_u],
    "cuDriverGetVersion": [_PI],
    "cuGetErrorName": [_i, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [_i, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGet": [_PI, _i],
    "cuDeviceGetAttribute": [_PI, _i, _i],
    "cuDevicePrimaryCtxRetain": [_PP, _i],
    "cuCtxPushCurrent_v2": [_p],
    "cuCtxPopCurrent_v2": [_PP],
    "cuModuleLoadData": [_PP, ctypes.c_char_p],
    "cuModuleGetFunction": [_PP, _p, ctypes.c_char_p],
    "cuFuncGetAttribute": [_PI, _i, _p],
    "cuFuncSetAttribute": [_p, _i, _i],
    "cuOccupancyMaxPotentialBlockSize": [_PI, _PI, _p, _p, _sz, _i],
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": [_PI, _p, _i, _sz],
    "cuLaunchKernel": [_p, _u, _u, _u, _u, _u, _u, _u, _p, _p, _p],
}
_launch_ex: Any = None
_opened: Any = None  # libcuda opened, before cuInit (entry_points)


def entry_points():
    """libcuda (ctypes, typed) without ``cuInit``: the functions' addresses for C code that calls
    them only after a module was loaded through :func:`driver` (the C-shim library, registered
    at import: registering must not initialise CUDA, which costs 100+ ms). Raises as
    :func:`driver` when there is no driver."""
    global _opened
    if _opened is not None:
        return _opened
    with _lock:
        if _opened is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                raise ToolchainError(f"the NVIDIA driver library libcuda.so.1 could not be loaded ({exc}). "
                                     f"Kernels compile without a GPU, but launching needs an NVIDIA GPU "
                                     f"and its driver (check nvidia-smi).") from None
            for name, argtypes in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
            _opened = lib
        return _opened


def driver():
    """libcuda (ctypes, typed) after ``cuInit``; a ToolchainError when there is no driver."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        lib = entry_points()
        err = lib.cuInit(0)
        if err:
            raise ToolchainError(f"the CUDA driver could not be initialised ({error_name(err, lib)}). "
                                 f"Check that an NVIDIA GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES).")
        _lib = lib
        return lib


def error_name(err: int, lib=None) -> str:
    lib = lib or driver()
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    if lib.cuGetErrorName(int(err), ctypes.byref(name)) or name.value is None:
        return f"CUresult {int(err)}"
    lib.cuGetErrorString(int(err), ctypes.byref(text))
    return f"{name.value.decode()} ({int(err)}): {(text.value or b'').decode()}"


def check(result: int, what: str) -> None:
    if result:
        raise LaunchError(f"{what} failed: {error_name(result)}")


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, e.g. (13, 0)."""
    v = ctypes.c_int()
    check(driver().cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    return v.value // 1000, (v.value % 1000) // 10


def _device(ordinal: int) -> int:
    dev = ctypes.c_int()
    check(driver().cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
    return dev.value


def primary_context(device: int) -> int:
    """The primary context of ``device`` (the one torch uses), retained once per process."""
    ctx = _contexts.get(device)
    if ctx is not None:
        return ctx
    with _lock:
        if device not in _contexts:
            out = ctypes.c_void_p()
            check(driver().cuDevicePrimaryCtxRetain(ctypes.byref(out), _device(device)),
                  f"cuDevicePrimaryCtxRetain({device})")
            _contexts[device] = out.value
        return _contexts[device]


class pushed_context:
    """``with pushed_context(dev):`` makes ``dev``'s primary context current, then restores."""

    def __init__(self, device: int) -> None:
        self.device = device

    def __enter__(self):
        check(driver().cuCtxPushCurrent_v2(primary_context(self.device)), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc) -> None:
        driver().cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


def device_attribute(device: int, name: str) -> int:
    value = ctypes.c_int()
    check(driver().cuDeviceGetAttribute(ctypes.byref(value), _DEVICE_ATTRIBUTES[name], _device(device)),
          f"cuDeviceGetAttribute({name})")
    return value.value


def device_arch(device: int) -> str:
    """``"sm_90"`` for an H100: the real arch of ``device`` (no context is created)."""
    major = device_attribute(device, "COMPUTE_CAPABILITY_MAJOR")
    minor = device_attribute(device, "COMPUTE_CAPABILITY_MINOR")
    return f"sm_{major}{minor}"


def load_module(code: bytes, device: int, *, kind: str, arch: str, nvrtc_version: str, name: str) -> int:
    """Load a cubin or PTX into ``device``'s primary context; explain the usual failures."""
    lib = driver()
    data = code if kind == "cubin" or code.endswith(b"\0") else code + b"\0"
    module = ctypes.c_void_p()
    with pushed_context(device):
        err = lib.cuModuleLoadData(ctypes.byref(module), data)
    if err == 0:
        return module.value
    if err in (_UNSUPPORTED_PTX, _INVALID_PTX) and kind == "ptx":
        major, minor = driver_version()
        raise LaunchError(
            f"the driver cannot JIT the PTX of {name}: it was made by NVRTC {nvrtc_version}, and "
            f"this driver supports CUDA {major}.{minor} ({error_name(err)}). PTX from an NVRTC "
            f"newer than the driver fails to load. Compile to a cubin instead (output='cubin', "
            f"the default), or install an NVRTC no newer than the driver "
            f"(pip install 'nvidia-cuda-nvrtc=={major}.{minor}.*'), or update the driver.")
    dev_arch = device_arch(device) if err in (_NO_BINARY, _INVALID_IMAGE, _UNSUPPORTED_PTX) else None
    if dev_arch is not None and kind == "cubin" and dev_arch == arch:
        major, minor = driver_version()
        raise LaunchError(
            f"the driver could not load the cubin of {name} for {arch} ({error_name(err)}): it was "
            f"made by NVRTC {nvrtc_version}, and this driver supports CUDA {major}.{minor}. A cubin "
            f"from an NVRTC of a newer major version than the driver does not load. Install an "
            f"NVRTC matching the driver (pip install 'nvidia-cuda-nvrtc=={major}.*' with "
            f"cuda-bindings {major}.x), or update the driver.")
    if err == _NO_BINARY or (dev_arch is not None and kind == "cubin" and dev_arch != arch):
        raise LaunchError(
            f"{name} was compiled for {arch} but cuda:{device} is {dev_arch} ({error_name(err)}). "
            f"Pass arch={dev_arch!r}, or unset OPSMITH_CUDA_ARCH so that the device's arch is used.")
    raise LaunchError(f"cuModuleLoadData for {name} on cuda:{device} failed: {error_name(err)}")


def get_function(module: int, lowered: str, display: str) -> int:
    fn = ctypes.c_void_p()
    err = driver().cuModuleGetFunction(ctypes.byref(fn), module, lowered.encode())
    if err:
        raise LaunchError(f"kernel {display!r} (symbol {lowered}) is not in the module: {error_name(err)}")
    return fn.value


def func_attribute(fn: int, name: str) -> int:
    value = ctypes.c_int()
    check(driver().cuFuncGetAttribute(ctypes.byref(value), FUNC_ATTRIBUTES[name], fn),
          f"cuFuncGetAttribute({name})")
    return value.value


def func_set_attribute(fn: int, name: str, value: int) -> None:
    check(driver().cuFuncSetAttribute(fn, FUNC_ATTRIBUTES[name], value), f"cuFuncSetAttribute({name})")


def occupancy_block_size(fn: int, shared_mem: int) -> int:
    """The block size with the best occupancy for a constant ``shared_mem`` per block."""
    grid, block = ctypes.c_int(), ctypes.c_int()
    check(driver().cuOccupancyMaxPotentialBlockSize(ctypes.byref(grid), ctypes.byref(block), fn,
                                                    None, shared_mem, 0),
          "cuOccupancyMaxPotentialBlockSize")
    return block.value


def occupancy_active_blocks(fn: int, block_size: int, shared_mem: int) -> int:
    n = ctypes.c_int()
    check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), fn, block_size, shared_mem),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return n.value


def occupancy_active_clusters(fn: int, dims: tuple) -> int:
    """The clusters of kernel ``fn`` (its cluster size compiled in: ``__cluster_dims__``) that the current
    context's device holds at once, launched at ``dims`` (a LaunchConfig's grid x, y, z, block x, y, z and
    dynamic shared memory): ``cuOccupancyMaxActiveClusters`` (CUDA 12.0+). 0 where the driver cannot say."""
    f = getattr(driver(), "cuOccupancyMaxActiveClusters", None)
    if f is None:
        return 0
    from opsmith._runtime._launch_config import _CULaunchConfig
    cfg, n = _CULaunchConfig(*dims, None, None, 0), ctypes.c_int()
    return n.value if f(ctypes.byref(n), ctypes.c_void_p(fn), ctypes.byref(cfg)) == 0 else 0


def raw_launch():
    """libcuda's ``cuLaunchKernel``, typed (11 converted arguments per call)."""
    return driver().cuLaunchKernel


def launch_ex():
    """libcuda's ``cuLaunchKernelEx`` (CUDA 12.0+) with no argtypes: the hot path.

    Called with four pre-built ``c_void_p`` objects (config, function, parameters, NULL),
    ctypes converts nothing, which measured faster than ``cuLaunchKernel``'s eleven typed
    arguments and than cuda-bindings (bench/bench_kernels.py).
    """
    global _launch_ex
    if _launch_ex is None:
        lib = driver()
        try:
            fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx  # a separate, untyped handle
        except AttributeError:
            raise ToolchainError("the NVIDIA driver is older than CUDA 12.0 (no cuLaunchKernelEx); "
                                 "update the driver") from None
        fn.restype = ctypes.c_int
        del lib
        _launch_ex = fn
    return _launch_ex
