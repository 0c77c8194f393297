"""An op's CUDA implementation as a boxed C kernel registered through torch's C shim.

torch >= 2.8 exports plain C functions to register a boxed kernel
(``aoti_torch_library_init_impl``, ``aoti_torch_library_impl``) and to work on tensors
(``aoti_torch_empty_strided``, ``aoti_torch_get_data_ptr``, ...). The library's C++ is a real
file, ``opsmith/_torch/cshim/osm_cshim.cpp`` (package data; :mod:`opsmith._torch._cshim_source`
reads it and the limits and function order it declares). Built once through the shared-library
profile with no torch header and no link against torch or libcuda, it receives their addresses
(and the driver's) from Python and registers, per op, a kernel that checks the inputs,
allocates the outputs and launches on the current stream with no Python on the call path.

How launch code is shared: C libraries that run without Python (export-c, the ONNX Runtime
library) open the driver themselves through the C launch core in ``opsmith/_runtime/launch/``.
Code hosted by Python opens it once, through :mod:`opsmith._runtime._driver`: ``Kernel`` calls
its ctypes functions, the C launcher ``_claunch`` receives ``cuLaunchKernelEx``'s address from
it, and this library receives ``cuLaunchKernel`` and the context functions from it (and each
kernel's function and primary context from the kernel's own loader), so a process that uses
torch has one driver handle and one set of primary contexts.

It serves ops that fit: every argument a Tensor, every output ``Out()``/``Out(like=...)``
(no shape, dtype or zeros rule), the default elementwise launch rule, and kernels whose
parameters are the op's tensors, its outputs and an item count. Others keep the generated
Python implementation (:mod:`opsmith._torch._ops`), as do torch builds without the shim.
``OPSMITH_TORCH_OP_CSHIM=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Any

from opsmith._errors import LaunchError, OpsmithError

__all__ = ["LIBRARY", "available", "build", "fits", "library", "load", "register", "source_sha256"]

log = logging.getLogger(__name__)

_lock = threading.RLock()
_state: dict[str, Any] = {}
_PREPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)
_P_INPUT, _P_OUTPUT, _P_COUNT32, _P_COUNT64 = 0, 1, 2, 3
_P_INT32, _P_INT64, _P_UINT32, _P_F32, _P_F64, _P_BOOL = 4, 5, 6, 7, 8, 9
_ARG_KIND = {"Tensor": 0, "int": 1, "float": 2, "bool": 3}  # osm_cshim.cpp's A_*


def _torch_lib(name: str):
    import torch
    path = os.path.join(os.path.dirname(torch.__file__), "lib", name)
    return ctypes.CDLL(path) if os.path.exists(path) else None  # already loaded by torch: same handle


def _symbols(cuda: bool) -> dict[str, int] | None:
    """The shim's function addresses, or None when this torch lacks one of them."""
    from opsmith._torch import _cshim_source
    cpu = _torch_lib("libtorch_cpu.so")
    libs = [cpu] + ([_torch_lib("libtorch_cuda.so")] if cuda else [])
    if any(lib is None for lib in libs):
        return None
    out: dict[str, int] = {}
    for name in _cshim_source.read().api_names:
        if name.startswith("cu"):
            continue
        if name == "aoti_torch_get_current_cuda_stream" and not cuda:
            out[name] = 0
            continue
        addr = None
        for lib in libs:
            try:
                addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                break
            except AttributeError:
                continue
        if not addr:
            return None
        out[name] = addr
    return out


def available(cuda: bool = True) -> bool:
    """True when this torch exports the shim functions (torch >= 2.8; with CUDA for ``cuda``)."""
    key = f"available/{cuda}"
    if key not in _state:
        try:
            _state[key] = _symbols(cuda) is not None
        except OSError:
            _state[key] = False
    return _state[key]


def why_not(op, kernels, binding: list[str], launch) -> str | None:
    """Why ``op``'s CUDA implementation cannot be the C kernel here (:func:`fits`, this torch's
    shim, the driver), or None."""
    why = fits(op, kernels, binding, launch)
    if why is None and not available(cuda=True):
        why = "this torch exports no CUDA shim (torch < 2.8 or a CPU-only build)"
    return why if why is not None else no_driver()  # a CUDA torch on a machine with no driver


def no_driver() -> str | None:
    """Why the C kernel cannot be set up here (no loadable libcuda.so.1), or None; once per process.
    The library takes the driver's entry points when it loads; the Python CUDA implementation
    needs the driver only at a launch, so an op still registers where there is none."""
    if "no_driver" not in _state:
        from opsmith._runtime import _driver
        try:
            _driver.entry_points()
            _state["no_driver"] = None
        except OpsmithError as exc:
            _state["no_driver"] = f"no CUDA driver ({exc})"
    return _state["no_driver"]


def library():
    """The built and initialised op library (ctypes), once per process."""
    with _lock:
        lib = _state.get("lib")
        if lib is None:
            lib = _state["lib"] = load(build())
        return lib


LIBRARY = "opsmith_cshim"


def source_sha256() -> str:
    """The sha256 of the library's source (packages name their prebuilt copy by it)."""
    import hashlib
    from importlib import resources

    from opsmith._torch import _cshim_source
    return hashlib.sha256(resources.files(_cshim_source.PACKAGE).joinpath(_cshim_source.RESOURCE)
                          .read_bytes()).hexdigest()


def build() -> str:
    """Build (or find in the cache, or in an installed opsmith package) the library; returns its path."""
    from importlib import resources

    from opsmith._build._profile_shared import build_shared_library
    from opsmith._torch import _cshim_source
    _cshim_source.read()  # a clear error when the packaged source is missing
    source = resources.files(_cshim_source.PACKAGE).joinpath(_cshim_source.RESOURCE)
    from opsmith._build import _prebuilt
    digest = source_sha256()
    pre = _prebuilt.library(LIBRARY, digest)  # an installed opsmith package's copy: no compiler
    if pre is not None:
        return pre
    with resources.as_file(source) as path:  # the file itself; a temporary copy only from a zip
        art = build_shared_library(LIBRARY, [str(path)], with_cuda=False,
                                   extra_cflags=["-std=c++17", "-fvisibility=hidden"])
    _prebuilt.built_library(LIBRARY, digest, str(art.path))  # a package records it
    return str(art.path)


def load(path: str, launch=None, ctx_fns=None):
    """Open the library at ``path`` and hand it the shim's and the driver's functions.

    ``launch``/``ctx_fns`` replace ``cuLaunchKernel`` and the context functions (tests on a
    CPU-only machine pass ctypes callbacks, on a copy of the library of its own); by default
    they come from libcuda.
    """
    from opsmith._torch import _cshim_source
    api_names = _cshim_source.read().api_names
    lib = ctypes.CDLL(path)
    if lib.osm_abi() != 2 or lib.osm_api_count() != len(api_names):
        raise OpsmithError(f"the C-shim op library at {path} is of another version than "
                           f"{_cshim_source.RESOURCE} ({lib.osm_api_count()} API functions, "
                           f"{len(api_names)} expected); clear the cache (opsmith cache clear)")
    cuda = launch is None
    syms = _symbols(cuda)
    if syms is None:
        raise OpsmithError("this torch does not export the C shim functions opsmith registers ops "
                           "through (torch >= 2.8 does); set OPSMITH_TORCH_OP_CSHIM=0")
    if cuda:
        from opsmith._runtime import _driver
        drv = _driver.entry_points()  # no cuInit here: a kernel's loader initialises before its first launch
        for name in ("cuLaunchKernel", "cuCtxGetDevice", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"):
            syms[name] = ctypes.cast(getattr(drv, name), ctypes.c_void_p).value
    else:
        lib._opsmith_keep = [launch, *(ctx_fns or ())]
        syms["cuLaunchKernel"] = ctypes.cast(launch, ctypes.c_void_p).value
        for name, fn in zip(("cuCtxGetDevice", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"), ctx_fns or ()):
            syms[name] = ctypes.cast(fn, ctypes.c_void_p).value
    table = (ctypes.c_void_p * len(api_names))(*[syms.get(n) or None for n in api_names])
    lib.osm_init(table)
    ints, i32 = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int32)
    lib.osm_describe.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ints, ctypes.c_int,
                                 ints, i32, ctypes.c_int, ints, ints, ctypes.c_int, i32, ints, _PREPARE]
    lib.osm_set_function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_uint, ctypes.c_void_p]
    lib.osm_set_error.argtypes = [ctypes.c_int, ctypes.c_char_p]
    lib.osm_register.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    lib._opsmith_slots = []  # per slot: (op, kernels, prepare callback), alive as long as the registration
    return lib


def _scalar_kind(p) -> int | None:
    """The P_* of a kernel parameter that takes a scalar argument, or None when the C path cannot."""
    size = ctypes.sizeof(p.ctypes_type)
    if p.kind == "float":
        return _P_F32 if size == 4 else _P_F64
    if p.kind == "bool":
        return _P_BOOL
    if p.kind == "int":
        if size == 8 and p.range[0] < 0:
            return _P_INT64
        if size == 4:
            return _P_INT32 if p.range[0] < 0 else _P_UINT32
    return None


def fits(op, kernels, binding: list[str], launch) -> str | None:
    """None when ``op`` can be served by the C kernel, else why not (logged, not raised)."""
    from opsmith._torch import _cshim_source
    from opsmith._torch._elementwise import Elementwise
    src = _cshim_source.read()
    s = op.schema
    if launch is not None and not isinstance(launch, Elementwise):
        return "it has a launch rule function"
    if not all(t in _ARG_KIND for t in s.arg_types):
        return "an argument is neither a Tensor nor an int, float or bool"
    if len(s.arg_names) > src.max_tensors or s.returns > src.max_tensors or len(kernels) > src.max_kernels:
        return "too many tensors or kernels"
    for o in op.outs:
        if o.shape is not None or o.zeros:
            return "an output has a shape or zeros rule"
        if o.dtype is not None and _out_dtype(o, s) is None:
            return "an output's dtype is a function"
    types = dict(zip(s.arg_names, s.arg_types))
    kinds = {tuple(_scalar_kind(p) if p.kind != "tensor" else None for p in k.params) for k in kernels}
    if len(kinds) > 1:  # one description per op: every kernel takes each number in one C type
        return "the kernels take a number in different C types (float and double)"
    for k in kernels:
        if len(k.params) > src.max_params:
            return "too many kernel parameters"
        for p, b in zip(k.params, binding):
            if p.kind == "tensor":
                if b == "_n" or types.get(b, "Tensor") != "Tensor":
                    return f"pointer parameter {p.name} takes the count or a number"
            elif b == "_n":
                if p.kind != "int" or ctypes.sizeof(p.ctypes_type) not in (4, 8) or p.range[0] > 0:
                    return "the count parameter is not a 32- or 64-bit integer"
            elif types.get(b) in ("int", "float", "bool"):
                if _scalar_kind(p) is None:
                    return f"parameter {p.name} ({p.ctype}) takes a number the C path does not convert to"
                if types[b] == "float" and p.kind != "float":
                    return f"parameter {p.name} is an integer and takes the float argument {b}"
            else:
                return f"parameter {p.name} is neither a tensor, a number nor the item count"
    return None


def _out_dtype(o, s):
    """An output's dtype rule as ("dtype", name) or ("input", index); None for a function."""
    import torch
    d = o.dtype
    if d is None:
        return ("like", None)
    if isinstance(d, torch.dtype):
        return ("dtype", str(d).replace("torch.", ""))
    if isinstance(d, str) and isinstance(getattr(torch, d, None), torch.dtype):
        return ("dtype", d)
    if isinstance(d, str) and d in s.arg_names:
        return ("input", s.arg_names.index(d))
    if isinstance(d, int) and not isinstance(d, bool) and 0 <= d < len(s.arg_names):
        return ("input", d)
    return None


def _like_index(o, s) -> int:
    tensors = [i for i, t in enumerate(s.arg_types) if t == "Tensor"]
    if o.like is None:
        return tensors[0]
    if isinstance(o.like, int):
        return o.like
    return s.arg_names.index(o.like)


def _dtype_code(cpu_lib, name: str) -> int:
    fn = getattr(cpu_lib, f"aoti_torch_dtype_{name}", None)
    if fn is None:
        raise OpsmithError(f"torch's shim has no dtype {name}")
    fn.restype = ctypes.c_int32
    return int(fn())


def register(op, kernels, binding: list[str], *, key: str = "CUDA", prepare=None, lib=None) -> None:
    """Register ``op``'s implementation for ``key`` as the C kernel (see the module's docstring).

    ``prepare(kernel_index, device) -> (function, block, context)`` loads a kernel on a device;
    by default the opsmith kernel's own loader (tests pass their own, and their own ``lib``).
    """
    lib = library() if lib is None else lib
    s = op.schema
    cpu_lib = _torch_lib("libtorch_cpu.so")
    dev_type_fn = getattr(cpu_lib, f"aoti_torch_device_type_{key.lower()}")
    dev_type_fn.restype = ctypes.c_int32
    device_type = int(dev_type_fn())
    pkind, pindex = [], []
    types = dict(zip(s.arg_names, s.arg_types))
    for p, b in zip(kernels[0].params, binding):
        if types.get(b) in ("int", "float", "bool"):
            pkind.append(_scalar_kind(p))
            pindex.append(s.arg_names.index(b))
        elif b == "_n":
            pkind.append(-1)  # filled per kernel below (all kernels bind alike)
            pindex.append(0)
        elif b.startswith("_o"):
            pkind.append(_P_OUTPUT)
            pindex.append(int(b[2:]))
        else:
            pkind.append(_P_INPUT)
            pindex.append(s.arg_names.index(b))
    k0 = kernels[0]
    for i, (p, b) in enumerate(zip(k0.params, binding)):
        if b == "_n":
            pkind[i] = _P_COUNT32 if ctypes.sizeof(p.ctypes_type) == 4 else _P_COUNT64
    kdtype: list[int] = []
    for k in kernels:
        for p, kind in zip(k.params, pkind):
            if kind == _P_INPUT and len(p.dtypes) == 1:
                kdtype.append(_dtype_code(cpu_lib, p.dtypes[0]))
            else:
                kdtype.append(-1)
    like = [_like_index(o, s) for o in op.outs]
    odtype = []
    for k, o in enumerate(op.outs):
        how, what = _out_dtype(o, s)
        if how == "input":  # that input's dtype, which the C kernel reads per call: like it for the dtype
            if s.arg_types[what] != "Tensor":
                raise OpsmithError(f"{op.name}: Out(dtype={o.dtype!r}) names an argument that is not a tensor")
            odtype.append(-2 - what)
        else:
            odtype.append(_dtype_code(cpu_lib, what) if how == "dtype" else -1)
    from opsmith._torch._elementwise import Elementwise
    rule = op._launch_rule or Elementwise()
    ipt = [rule.items_for(k) for k in kernels]
    arg_kind = [_ARG_KIND[t] for t in s.arg_types]

    with _lock:
        slots = lib._opsmith_slots
        slot = len(slots)
        if slot >= lib.osm_max_ops():
            raise OpsmithError(f"{op.name}: at most {lib.osm_max_ops()} ops per process take the C-shim path")
        loader = prepare if prepare is not None else _kernel_loader(kernels)

        def on_device(slot_: int, kernel: int, device: int) -> int:
            try:
                fn, block, ctx = loader(kernel, device)
                return lib.osm_set_function(slot_, kernel, device, fn, block, ctx)
            except BaseException as exc:  # reported by the C kernel as the op's error
                lib.osm_set_error(slot_, f"{type(exc).__name__}: {exc}".encode()[:500])
                return 1

        cb = _PREPARE(on_device)
        ints = ctypes.c_int
        r = lib.osm_describe(slot, op.name.encode(), device_type, len(s.arg_names),
                             (ints * max(1, len(arg_kind)))(*arg_kind), s.returns,
                             (ints * max(1, len(like)))(*like), (ctypes.c_int32 * max(1, len(odtype)))(*odtype),
                             len(binding), (ints * len(pkind))(*pkind), (ints * len(pindex))(*pindex), len(kernels),
                             (ctypes.c_int32 * len(kdtype))(*kdtype), (ints * len(ipt))(*ipt), cb)
        if r:
            raise OpsmithError(f"{op.name}: the C-shim library refused the op's description")
        slots.append((op, kernels, cb))
        ns, opname = op.name.split("::")
        err = lib.osm_register(slot, ns.encode(), opname.encode(), key.encode())
        if err:
            raise OpsmithError(f"{op.name}: torch's aoti_torch_library_impl failed (error {err}); "
                               f"set OPSMITH_TORCH_OP_CSHIM=0 to use the Python implementation")


def _kernel_loader(kernels):
    def load(kernel: int, device: int):
        from opsmith._runtime import _driver
        from opsmith._torch import _cshim_source
        k = kernels[kernel]
        if device >= _cshim_source.read().max_devices:  # the C kernel refuses these before asking
            raise LaunchError(f"{k.name}: device {device} is beyond the C-shim path's device table")
        st = k._state(device)
        block = k.config_for(1, device=device).block[0]
        return st.fn, block, _driver.primary_context(device)
    return load
