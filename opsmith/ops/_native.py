"""opsmith.ops' CUDA implementations in C++ (``opsmith/ops/native/osm_ops.cpp``, package data).

A small torch C++ library, built once per torch version through the torch-extension profile
and cached like any extension (seconds once per machine, a cache hit after), registers the
CUDA kernels of the twelve ``torch.ops.opsmith`` operators: a call runs the argument checks,
the output allocation, the launch plan and ``cuLaunchKernel`` in C++, with no Python. The NVRTC
kernels themselves are compiled by Python (:mod:`opsmith.ops._sources`) the first time a
(kernel, dtype, device) is used: the C++ code calls back :func:`_prepare`, which loads the
kernel and hands back its ``CUfunction`` and the device's properties.

Where the library cannot be built (no C++ compiler, a torch without headers) a warning says so
once and the operators keep the Python implementations (:mod:`opsmith.ops._functional`);
``OPSMITH_OPS_NATIVE=0`` keeps them too.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from opsmith._errors import OpsmithError

__all__ = ["build", "consts", "eager_calls", "kernel_table", "library", "plan", "register", "usable"]


PACKAGE, RESOURCE = "opsmith.ops", "native/osm_ops.cpp"
_lock = threading.RLock()
_state: dict[str, Any] = {}
_PREPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)
_I64P = ctypes.POINTER(ctypes.c_int64)


def consts() -> list[int]:
    """The plans' numbers in osm_ops_plan.h's order (ROW_CHUNKS, ROW_THREADS, LONG_THREADS,
    EW_THREADS, EW_UNROLL, STATIC_SMEM, ROW_BWD_BLOCKS, LN_WIDE_TPR, WIDE_CHUNKS, CLUSTER_MAX,
    CLUSTER_THREADS, CLUSTER_FWD_BLOCKS, NORM_SPLIT_BYTES, WEIGHT_LANE_ROWS, WEIGHT_CLUSTER,
    WEIGHT_CLUSTER_BYTES, LN_FWD4_CHUNKS, L2_THREADS, L2_CHUNKS, L2_MIN_ROW_BYTES, L2_RMS_THREADS, C4_THREADS,
    C4_MIN_ROW_BYTES, WIDE3_THREADS, LOW_BW_SM_GBPS, SMALL_BWD_ROWS, SMALL_MIN_LANES, C8_MAX_ROW_BYTES,
    LN_FULL2_MAX_ROW_BYTES, L2_ONE_ROW_BYTES, L2_ONE_CHUNKS, LN_FULL2_HIGH_BW_ROWS, BWD_C4_CHUNKS,
    BWD_C4_LN_MIN_ROW_BYTES, L2_ONE_ROW_BYTES_HIGH_BW, L2_THREE_THREADS, L2_THREE_CHUNKS, L2_THREE_MAX_ROW_BYTES,
    L2_THREE_MAX_SM_GBPS, BWD_SM_THREADS):
    :mod:`opsmith.ops._launch`
    is their one source."""
    from opsmith.ops import _launch
    return [_launch.ROW_CHUNKS, _launch.ROW_THREADS, _launch.LONG_THREADS, _launch.EW_THREADS,
            _launch.EW_UNROLL, _launch._STATIC_SMEM, _launch.ROW_BWD_BLOCKS, _launch.LN_WIDE_TPR,
            _launch.WIDE_CHUNKS, _launch.CLUSTER_MAX, _launch.CLUSTER_THREADS, _launch.CLUSTER_FWD_BLOCKS,
            _launch.NORM_SPLIT_BYTES, _launch.WEIGHT_LANE_ROWS, _launch.WEIGHT_CLUSTER, _launch.WEIGHT_CLUSTER_BYTES,
            _launch.LN_FWD4_CHUNKS, _launch.L2_THREADS, _launch.L2_CHUNKS, _launch.L2_MIN_ROW_BYTES,
            _launch.L2_RMS_THREADS, _launch.C4_THREADS, _launch.C4_MIN_ROW_BYTES, _launch.WIDE3_THREADS,
            _launch.LOW_BW_SM_GBPS, _launch.SMALL_BWD_ROWS, _launch.SMALL_MIN_LANES, _launch.C8_MAX_ROW_BYTES,
            _launch.LN_FULL2_MAX_ROW_BYTES, _launch.L2_ONE_ROW_BYTES, _launch.L2_ONE_CHUNKS,
            _launch.LN_FULL2_HIGH_BW_ROWS, _launch.BWD_C4_CHUNKS, _launch.BWD_C4_LN_MIN_ROW_BYTES,
            _launch.L2_ONE_ROW_BYTES_HIGH_BW, _launch.L2_THREE_THREADS, _launch.L2_THREE_CHUNKS,
            _launch.L2_THREE_MAX_ROW_BYTES, _launch.L2_THREE_MAX_SM_GBPS, _launch.BWD_SM_THREADS]


def _props(p):
    """osm_ops_set_device's and osm_ops_plan's seven numbers of a DeviceProps."""
    return (ctypes.c_int64 * 7)(p.sm_count, p.max_threads_per_block, p.max_threads_per_sm, p.smem_per_block_optin,
                                p.smem_per_sm, int(p.clusters), p.mem_gbps)


def build() -> str:
    """Build (or find in the cache) the library for this torch; returns its path."""
    from importlib import resources

    from opsmith._torch._extension import build as build_extension
    folder = resources.files(PACKAGE).joinpath(RESOURCE.split("/")[0])
    if not folder.joinpath(RESOURCE.split("/")[1]).is_file():
        raise OpsmithError(f"opsmith's package data {RESOURCE} is missing from {PACKAGE}; reinstall opsmith")
    with resources.as_file(folder) as path:  # the folder itself (its headers too); a copy only from a zip
        art = build_extension("opsmith_ops_native", [str(path / RESOURCE.split("/")[1])], is_python_module=False,
                              extra_cflags=["-O2"])
    from opsmith._torch._native_lib import mark_built
    mark_built("opsmith_ops_native")
    return str(art.path)


def _open(path: str):
    import torch  # noqa: F401  (the library links against the torch libraries torch loaded)
    lib = ctypes.CDLL(path)
    if lib.osm_ops_abi() != 8:
        raise OpsmithError(f"the native opsmith.ops library at {path} is of another version; clear the cache "
                           "(opsmith cache clear)")
    lib.osm_ops_kernel_file.restype = ctypes.c_char_p
    lib.osm_ops_kernel_template.restype = ctypes.c_char_p
    lib.osm_ops_plan.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                 _I64P, _I64P]
    lib.osm_ops_softmax_fwd_kernel.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, _I64P]
    lib.osm_ops_init.argtypes = [ctypes.POINTER(ctypes.c_void_p), _I64P, ctypes.c_int, _PREPARE]
    lib.osm_ops_set_device.argtypes = [ctypes.c_int, _I64P, ctypes.c_void_p]
    lib.osm_ops_set_function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.osm_ops_set_error.argtypes = [ctypes.c_char_p]
    lib.osm_ops_register.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib._opsmith_path = path
    return lib


def library():
    """The loaded library (ctypes), built on first use; raises when it cannot be built."""
    with _lock:
        lib = _state.get("lib")
        if lib is None:
            lib = _state["lib"] = _open(build())
        return lib


def kernel_table(lib=None) -> list[tuple[str, str]]:
    """(file, template) of each kernel id of the library, in its order."""
    lib = library() if lib is None else lib
    return [(lib.osm_ops_kernel_file(k).decode(), lib.osm_ops_kernel_template(k).decode())
            for k in range(lib.osm_ops_kernel_count())]


def plan(which: str, rows: int, cols: int, itemsize: int, arrays: int, props, lib=None) -> tuple:
    """The C++ plan (``"elementwise"`` with ``rows`` = n and ``cols`` = 1 for the unrolled one, ``"row"``,
    ``"weight"``, ``"norm_bwd"``, ``"softmax"``, ``"cluster_fwd"``, ``"cluster_bwd"``, ``"ln_fwd4"``, ``"l2"``,
    ``"c4"``, ``"small"``, ``"c8"``, ``"ln_full2"``, ``"bwd_c4"``, ``"fwd"``, ``"bwd_sm"``) for ``props``
    (a :class:`~opsmith.ops._launch.DeviceProps`),
    as (strategy, grid, block, smem, cache, per_chunk, cluster, chunks), strategy None where a cluster plan (or
    ``"ln_fwd4"``, ``"l2"``, ``"c4"``, ``"small"``, ``"c8"``, ``"ln_full2"``, ``"bwd_c4"``, ``"bwd_sm"``) has none;
    before :func:`register` it uses the numbers of :func:`consts`."""
    lib = library() if lib is None else lib
    _init(lib, cuda=False)
    out = (ctypes.c_int64 * 10)()
    which_id = {"elementwise": 0, "row": 1, "weight": 2, "norm_bwd": 3, "softmax": 4, "cluster_fwd": 5,
                "cluster_bwd": 6, "ln_fwd4": 7, "l2": 8, "c4": 9, "small": 10, "c8": 11,
                "ln_full2": 12, "bwd_c4": 13, "fwd": 14, "bwd_sm": 15}[which]
    if lib.osm_ops_plan(which_id, rows, cols, itemsize, arrays, _props(props), out):
        raise OpsmithError(f"osm_ops_plan refused itemsize {itemsize}")
    names = {-1: None, 0: "elementwise", 1: "warp", 2: "block", 3: "long", 4: "columns", 5: "persistent", 6: "wide",
             7: "cluster", 8: "split", 9: "l2", 10: "small", 11: "c4", 12: "sm"}
    return names[out[0]], (out[1], out[2]), (out[3], out[4]), out[5], out[6], out[7], out[8], out[9]


def softmax_fwd_kernel(rows: int, cols: int, itemsize: int, aligned: bool, props, lib=None) -> tuple[str, str]:
    """(file, template) of the kernel the C++ softmax forward launches for rows x cols of ``itemsize`` bytes, x and y
    16-byte ``aligned`` or not, on ``props``: :func:`opsmith.ops._launch.softmax_fwd_kernel`'s twin."""
    lib = library() if lib is None else lib
    _init(lib, cuda=False)
    k = lib.osm_ops_softmax_fwd_kernel(rows, cols, itemsize, int(aligned), _props(props))
    if k < 0:
        raise OpsmithError(f"osm_ops_softmax_fwd_kernel refused itemsize {itemsize}")
    return kernel_table(lib)[k]


def _init(lib, cuda: bool) -> None:
    """Hand the library the plans' numbers and, with ``cuda``, the driver's and torch's functions."""
    done = getattr(lib, "_opsmith_init", None)  # None, "plans" (the numbers) or "cuda" (all of it)
    if done == "cuda" or (done == "plans" and not cuda):
        return
    fns = [None] * 6
    if cuda:
        from opsmith._runtime import _driver
        from opsmith._torch import _cshim
        drv = _driver.driver()
        fns = [ctypes.cast(getattr(drv, n), ctypes.c_void_p).value
               for n in ("cuLaunchKernel", "cuCtxGetDevice", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2")]
        cuda_lib = _cshim._torch_lib("libtorch_cuda.so")
        if cuda_lib is None or not hasattr(cuda_lib, "aoti_torch_get_current_cuda_stream"):
            raise OpsmithError("this torch has no aoti_torch_get_current_cuda_stream (torch >= 2.4 with CUDA does)")
        fns.append(ctypes.cast(cuda_lib.aoti_torch_get_current_cuda_stream, ctypes.c_void_p).value)
        clusters = getattr(drv, "cuOccupancyMaxActiveClusters", None)  # CUDA 12.0+ (_functional._resident)
        fns.append(ctypes.cast(clusters, ctypes.c_void_p).value if clusters is not None else None)
    numbers = consts()
    cb = _PREPARE(_prepare)
    if lib.osm_ops_init((ctypes.c_void_p * 6)(*fns), (ctypes.c_int64 * len(numbers))(*numbers), len(numbers), cb):
        raise OpsmithError("the native opsmith.ops library refused its constants (another version?); clear "
                           "the cache (opsmith cache clear)")
    lib._opsmith_keep = cb
    lib._opsmith_init = "cuda" if cuda else "plans"


# the kernels whose dynamic shared memory may pass 48 KiB, which takes an opt-in (cuFuncSetAttribute) before the C++
# launch: the long rows' row cache, the 4-chunk norm backwards' weight-gradient sums and weight (64-96 KiB), the
# two-block ones' (48 KiB for 16-bit rms_norm) and softmax's float backward staging grad_y (128 KiB)
_SHARED_ABOVE_48K = ("_long", "_bwd_c4", "_bwd_sm", "_wide_sm")


def _prepare(kernel: int, dtype: int, device: int) -> int:
    """Called from C++ the first time (kernel, dtype, device) runs: compile (a cache hit after the
    first machine-wide use) and load it, hand its function and the device back. 0 on success."""
    lib = _state["lib"]
    try:
        from opsmith._runtime import _driver
        from opsmith.ops import _launch, _sources
        file, template = _state["table"][kernel]
        dtype_name = list(_sources.DTYPES)[dtype]
        k = _sources.kernel(file, template, dtype_name, device)
        st = k._state(device)
        if any(part in template for part in _SHARED_ABOVE_48K):
            st.opt_in_shared()
        if lib.osm_ops_set_device(device, _props(_launch.device_props(device)), _driver.primary_context(device)):
            raise OpsmithError(f"cuda:{device} is beyond the native library's {lib.osm_ops_max_devices()} devices")
        if lib.osm_ops_set_function(kernel, dtype, device, st.fn):
            raise OpsmithError("osm_ops_set_function refused the kernel")
        return 0
    except BaseException as exc:  # noqa: BLE001  (reported by the C++ kernel as the op's error)
        lib.osm_ops_set_error(f"{type(exc).__name__}: {exc}".encode()[:500])
        return 1


def usable() -> bool:
    """True when the native path is on and its library builds; a failure is logged once."""
    from opsmith._config import settings
    from opsmith._torch._native_lib import usable as _usable
    return _usable(_state, settings.ops_native, library, "opsmith.ops' native CUDA implementations",
                   "the ops use their Python implementations", "OPSMITH_OPS_NATIVE", "opsmith_ops_native")


def register() -> None:
    """Register the C++ CUDA kernels of ``torch.ops.opsmith.*`` (their schemas defined first)."""
    from opsmith.ops import _sources
    with _lock:
        lib = library()
        table = kernel_table(lib)
        for file, template in table:  # the C++ table names only kernels the sources have
            if template not in _sources.FILES.get(file, ()):
                raise OpsmithError(f"the native opsmith.ops library names kernel {template} of {file}, which "
                                   f"opsmith/ops/_sources.py does not have; reinstall opsmith")
        _state["table"] = table
        _init(lib, cuda=True)
        err = ctypes.create_string_buffer(1024)
        if lib.osm_ops_register(err, len(err)):
            raise OpsmithError(f"registering opsmith.ops' native CUDA kernels failed: {err.value.decode(errors='replace')}")


def eager_calls(fallbacks: dict):
    """The library's module of eager calls (``osm_ops_python.h``): a function per name of
    ``fallbacks`` (relu, silu, gelu, softmax, layer_norm_y, rms_norm_y) that makes the typed
    dispatcher call of that operator from the public function's arguments, handing anything it
    does not take (a tensor subclass, a torch-function mode, another argument type, an error) to
    ``fallbacks[name]``, the OpOverload builtin. Made once, after :func:`register`."""
    with _lock:
        mod = _state.get("eager")
        if mod is None:
            make = ctypes.PyDLL(library()._opsmith_path).osm_ops_python  # the same handle: already loaded
            make.restype, make.argtypes = ctypes.py_object, [ctypes.py_object]
            mod = _state["eager"] = make(dict(fallbacks))
        return mod
