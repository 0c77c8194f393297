"""Launch geometry and kernel resources: :class:`LaunchConfig`, :class:`KernelAttributes`, and the
driver's ``CUlaunchConfig`` struct built once per config and stream."""
from __future__ import annotations

import ctypes
import operator
from typing import Any

from opsmith._errors import LaunchError
from opsmith._record import Record

__all__ = ["LaunchConfig", "KernelAttributes", "MAX_GRID", "MAX_BLOCK", "ex_config"]

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)

def _dim3(value: Any, what: str) -> tuple[int, int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        dims = [value]
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        dims = list(value)
    else:
        raise LaunchError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    out = []
    for d in dims:
        try:
            d = operator.index(d)
        except TypeError:
            raise LaunchError(f"{what} must hold ints, got {value!r}") from None
        if d < 1:
            raise LaunchError(f"{what} {value!r} has a dimension below 1; every dimension must be >= 1")
        out.append(d)
    return tuple(out + [1] * (3 - len(out)))  # type: ignore[return-value]


class LaunchConfig:
    """Grid, block and dynamic shared memory of a launch; validated once, reusable, immutable.

    Parameters
    ----------
    grid, block : int or tuple of 1 to 3 ints
    shared_mem : int
        Dynamic shared memory per block, in bytes.

    Examples
    --------
    >>> cfg = LaunchConfig(grid=(4,), block=256)
    >>> cfg.grid, cfg.block, cfg.shared_mem
    ((4, 1, 1), (256, 1, 1), 0)
    """

    # a plain class, not a dataclass: defining one costs ~0.8 ms at import (warm-load budget)
    __slots__ = ("grid", "block", "shared_mem", "_dims", "_ex")

    def __init__(self, grid: tuple[int, ...] | int, block: tuple[int, ...] | int, shared_mem: int = 0) -> None:
        grid, block = _dim3(grid, "grid"), _dim3(block, "block")
        for axis, (g, lim) in enumerate(zip(grid, MAX_GRID)):
            if g > lim:
                raise LaunchError(f"grid {grid}: dimension {'xyz'[axis]} is {g}, the most CUDA allows is {lim}")
        for axis, (b, lim) in enumerate(zip(block, MAX_BLOCK)):
            if b > lim:
                raise LaunchError(f"block {block}: dimension {'xyz'[axis]} is {b}, the most CUDA allows is {lim}")
        if block[0] * block[1] * block[2] > 1024:
            raise LaunchError(f"block {block} has {block[0] * block[1] * block[2]} threads; a block "
                              f"holds at most 1024")
        try:
            smem = operator.index(shared_mem)
        except TypeError:
            raise LaunchError(f"shared_mem must be an int (bytes), got {shared_mem!r}") from None
        if smem < 0:
            raise LaunchError(f"shared_mem must be >= 0 bytes, got {smem}")
        setter = object.__setattr__
        setter(self, "grid", grid)
        setter(self, "block", block)
        setter(self, "shared_mem", smem)
        setter(self, "_dims", (*grid, *block, smem))
        setter(self, "_ex", {})  # raw stream -> pointer to a filled CUlaunchConfig

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("LaunchConfig is immutable; make a new one")

    def __reduce__(self):  # the per-stream driver structs stay behind
        return (LaunchConfig, (self.grid, self.block, self.shared_mem))

    def __eq__(self, other: object) -> bool:
        if type(other) is not LaunchConfig:
            return NotImplemented
        return self._dims == other._dims

    def __hash__(self) -> int:
        return hash(self._dims)

    def __repr__(self) -> str:
        return f"LaunchConfig(grid={self.grid}, block={self.block}, shared_mem={self.shared_mem})"

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.block[0] * self.block[1] * self.block[2]


class KernelAttributes(Record):
    """What the compiled kernel needs per thread and block, read from the driver.

    Fields: registers, static_shared_bytes, max_dynamic_shared_bytes, local_bytes,
    const_bytes, max_threads_per_block, ptx_version, binary_version. ``local_bytes`` above
    zero means register spills or a stack array: slow local memory.
    """

    __slots__ = ("registers", "static_shared_bytes", "max_dynamic_shared_bytes", "local_bytes",
                 "const_bytes", "max_threads_per_block", "ptx_version", "binary_version")

    @property
    def spills(self) -> bool:
        return self.local_bytes > 0


class _CULaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h), the first argument of ``cuLaunchKernelEx``."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


def ex_config(config: LaunchConfig, stream: int) -> ctypes.c_void_p:
    """A CUlaunchConfig for ``config`` on ``stream``, built once and kept on the config."""
    if len(config._ex) >= 64:  # streams come and go: keep the cache small
        config._ex.clear()
    cfg = _CULaunchConfig(*config._dims, stream, None, 0)
    ptr = ctypes.c_void_p(ctypes.addressof(cfg))
    ptr._keep = cfg  # the pointer keeps its struct alive
    config._ex[stream] = ptr
    return ptr
