"""The native Autograd kernels of opsmith ops: a small torch C++ library, built once per torch.

The library's C++ is ``opsmith/_torch/autograd/osm_autograd.cpp`` (package data). It is built
through the torch-extension profile (torch's flags, the precompiled torch header, the normal
store: a few seconds once per machine and torch version, a cache hit after) and loaded with
ctypes; :func:`register` hands it one op's :class:`~opsmith._torch._op_autograd.Plan`, and the
kernel it registers for the op's Autograd key runs with no Python on the call path (see the
C++ file for what it does).

A build that fails (no C++ compiler) is logged once and the op keeps the generated Python
Autograd kernel; ``OPSMITH_TORCH_OP_NATIVE_AUTOGRAD=0`` keeps it too.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from opsmith._errors import OpsmithError

__all__ = ["library", "register", "build", "usable"]


PACKAGE, RESOURCE = "opsmith._torch", "autograd/osm_autograd.cpp"
_lock = threading.Lock()
_state: dict[str, Any] = {}


def build() -> str:
    """Build (or find in the cache) the library for this torch; returns its path."""
    from importlib import resources

    from opsmith._torch._extension import build as build_extension
    source = resources.files(PACKAGE).joinpath(RESOURCE)
    if not source.is_file():
        raise OpsmithError(f"opsmith's package data {RESOURCE} is missing from {PACKAGE}; reinstall opsmith")
    with resources.as_file(source) as path:  # the file itself; a temporary copy only from a zip
        art = build_extension("opsmith_autograd", [str(path)], is_python_module=False, extra_cflags=["-O2"])
    from opsmith._torch._native_lib import mark_built
    mark_built("opsmith_autograd")
    return str(art.path)


def library():
    """The loaded library (ctypes), built on first use; raises when it cannot be built."""
    with _lock:
        lib = _state.get("lib")
        if lib is None:
            import torch  # noqa: F401  (the library links against the torch libraries torch loaded)
            lib = ctypes.CDLL(build())
            if lib.osm_ag_abi() != 1:
                raise OpsmithError("the native autograd library in the cache is of another version; "
                                   "clear the cache (opsmith cache clear)")
            ints = ctypes.POINTER(ctypes.c_int)
            lib.osm_ag_register.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ints, ctypes.c_int,
                                            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ints, ints,
                                            ctypes.c_int, ints, ctypes.c_char_p, ctypes.c_int]
            _state["lib"] = lib
        return lib


def usable() -> bool:
    """True when the native path is on and its library builds; a failure is logged once."""
    from opsmith._config import settings
    from opsmith._torch._native_lib import usable as _usable
    return _usable(_state, settings.torch_op_native_autograd, library, "native Autograd kernels",
                   "ops use the Python Autograd kernel", "OPSMITH_TORCH_OP_NATIVE_AUTOGRAD", "opsmith_autograd")


def register(op_name: str, plan) -> None:
    """Register ``plan`` (a :class:`~opsmith._torch._op_autograd.Plan`) as ``op_name``'s Autograd kernel."""
    lib = library()
    ns, name = op_name.split("::")

    def ints(values):
        values = list(values)
        return (ctypes.c_int * max(1, len(values)))(*values)

    err = ctypes.create_string_buffer(512)
    backward = plan.backward.encode() if plan.backward else None
    refuse = plan.refuse.encode() if plan.refuse else None
    r = lib.osm_ag_register(ns.encode(), name.encode(), len(plan.arg_kind), ints(plan.arg_kind), plan.n_outs,
                            backward, refuse, len(plan.bargs), ints(k for k, _ in plan.bargs),
                            ints(i for _, i in plan.bargs), len(plan.grads_for), ints(plan.grads_for), err, len(err))
    if r:
        raise OpsmithError(f"{op_name}: the native Autograd kernel was refused: {err.value.decode(errors='replace')}")
