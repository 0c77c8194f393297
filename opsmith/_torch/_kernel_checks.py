"""A :class:`~opsmith._torch._kernel.Kernel`'s argument checks: the conversions a launch
falls back to and the errors it raises (built only on failure), the stream and the device.
"""
from __future__ import annotations

import operator
from typing import Any

from opsmith._errors import LaunchError, ToolchainError
from opsmith._runtime import _signature as sig

__all__ = ["ArgChecks"]

_MISSING = type("_Missing", (), {"__repr__": lambda self: "<missing>"})()


class ArgChecks:
    """The failure side of a kernel's launch: each method names the argument and the fix.

    Mixed into :class:`~opsmith._torch._kernel.Kernel`, which has ``name`` and ``params``.
    """

    __slots__ = ()
    name: str
    params: tuple

    def _where(self, p: sig.Param) -> str:
        return f"{self.name}: {p.describe()} expects {p.expects()}"

    def _fail_count(self, args) -> None:
        args = [a for a in args if a is not _MISSING]
        decl = ", ".join(p.ctype for p in self.params)
        raise LaunchError(f"{self.name}({decl}) takes {len(self.params)} argument(s), got "
                          f"{len(args)}: {', '.join(_show(a) for a in args) or 'none'}")

    def _fail_arg(self, i: int, a: Any) -> None:
        p = self.params[i]
        if p.kind == "tensor":
            if not _is_tensor(a):
                got = _show(a)
                hint = " (pass the tensor itself, not its data_ptr())" if isinstance(a, int) else ""
                raise LaunchError(f"{self._where(p)}; got {got}{hint}")
            if p.dtypes and str(a.dtype).replace("torch.", "") not in p.dtypes:
                raise LaunchError(f"{self._where(p)}; got a {a.dtype} tensor")
            if not a.is_contiguous():
                raise LaunchError(f"{self._where(p)}; got a non-contiguous tensor (shape "
                                  f"{tuple(a.shape)}, strides {a.stride()}): call .contiguous() first")
            if a.data_ptr() % p.align == 0 and a.get_device() < 0:
                raise LaunchError(f"{self._where(p)}; got a tensor on {a.device} (move it with .cuda())")
            raise LaunchError(f"{self._where(p)}; got a tensor whose data pointer {a.data_ptr():#x} is "
                              f"not {p.align}-byte aligned (a view at an offset?): pass an aligned "
                              f"tensor, e.g. .clone()")
        if p.kind in ("int", "bool"):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}, which does not fit {p.ctype}")
        raise LaunchError(f"{self._where(p)}; got {_show(a)}")

    def _fail_device(self, i: int, a: Any, dev: int) -> None:
        p = self.params[i]
        if dev < 0:
            raise LaunchError(f"{self._where(p)}; got a tensor on {a.device} (move it with .cuda())")
        raise LaunchError(f"{self._where(p)} on the same device as the first tensor argument "
                          f"(cuda:{dev}); got a tensor on {a.device}")

    def _as_int(self, i: int, a: Any) -> int:
        p = self.params[i]
        if isinstance(a, (float, complex)) or _is_tensor(a):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}")
        try:
            return operator.index(a)
        except TypeError:
            raise LaunchError(f"{self._where(p)}; got {_show(a)}") from None

    def _as_bool(self, i: int, a: Any) -> int:
        v = self._as_int(i, a)
        if v not in (0, 1):
            self._fail_arg(i, a)
        return v

    def _as_float(self, i: int, a: Any) -> float:
        p = self.params[i]
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(a)
        if _is_tensor(a) or isinstance(a, (str, bytes, complex, bool)):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}")
        try:
            return float(a)
        except (TypeError, ValueError):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}") from None


def _show(a: Any) -> str:
    if _is_tensor(a):
        return f"a {a.dtype} tensor on {a.device}"
    text = repr(a)
    return f"{type(a).__name__} {text[:60]}"


def _is_tensor(a: Any) -> bool:
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _stream_handle(stream: Any, dev: int) -> int:
    """A raw CUstream from a torch.cuda.Stream (checked against the device) or an int."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        sdev = getattr(stream, "device_index", dev)
        if sdev != dev:
            raise LaunchError(f"the stream is on cuda:{sdev} but the tensors are on cuda:{dev}")
        return handle
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise LaunchError(f"stream must be a torch.cuda.Stream or a raw CUstream int, got {type(stream).__name__}")


def _current_device() -> int:
    import torch
    if not hasattr(torch._C, "_cuda_getDevice"):  # torch.cuda would raise a bare AssertionError
        _no_cuda_torch()
    try:
        return torch.cuda.current_device()
    except (AssertionError, RuntimeError) as exc:  # no driver, no device
        raise ToolchainError(f"torch cannot use a CUDA device here ({exc}): kernels compile without "
                             f"a GPU, but launching and kernel.attributes need an NVIDIA GPU, its "
                             f"driver and a CUDA build of torch (check nvidia-smi).") from None


def _no_cuda_torch(*_args) -> int:
    raise ToolchainError("this torch has no CUDA support (a CPU-only build): kernels compile here but "
                      "cannot run. Install a CUDA build of torch on a machine with an NVIDIA GPU.")
