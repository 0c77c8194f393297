"""``opsmith.Elementwise``: the declarative launch rule of an elementwise kernel op.

``custom_op(..., launch=Elementwise(bytes_per_thread=64))`` launches a 1-D grid over the item
count ``n`` of the first output, ``ceil(n / (block * items))`` blocks, where ``items`` is what
one thread handles (``items_per_thread``, or ``bytes_per_thread`` over the itemsize of the
kernel's first tensor parameter: 16 floats or 32 halves for 64 bytes). The default launch
(``launch=None``) is ``Elementwise(1)``. Being data, not a function, the rule also runs in the
C-shim boxed kernel, with no Python on the call path (a ``launch=`` function cannot).
"""
from __future__ import annotations

from opsmith._errors import SpecError

__all__ = ["Elementwise"]


class Elementwise:
    """A 1-D launch of ``ceil(n / (block * items))`` blocks over the first output's ``n`` items.

    Parameters
    ----------
    items_per_thread : int
        Items one thread handles (a grid-stride or vectorised kernel); default 1.
    bytes_per_thread : int, optional
        Instead: bytes of the kernel's first tensor parameter one thread handles (the kernel
        must declare that parameter's element type, e.g. ``const float*``).

    Examples
    --------
    >>> Elementwise(bytes_per_thread=64)
    Elementwise(bytes_per_thread=64)
    """

    __slots__ = ("items_per_thread", "bytes_per_thread")

    def __init__(self, items_per_thread: int = 1, *, bytes_per_thread: int | None = None) -> None:
        for what, v in (("items_per_thread", items_per_thread), ("bytes_per_thread", bytes_per_thread)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise SpecError(f"Elementwise({what}=...) is a positive int, got {v!r}")
        self.items_per_thread, self.bytes_per_thread = items_per_thread, bytes_per_thread

    def __repr__(self) -> str:
        if self.bytes_per_thread is not None:
            return f"Elementwise(bytes_per_thread={self.bytes_per_thread})"
        return f"Elementwise(items_per_thread={self.items_per_thread})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Elementwise) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    def items_for(self, kernel) -> int:
        """The items one thread of ``kernel`` handles."""
        if self.bytes_per_thread is None:
            return self.items_per_thread
        import torch
        first = next((p for p in kernel.params if p.kind == "tensor"), None)
        if first is None or len(first.dtypes) != 1:
            raise SpecError(f"{kernel.name}: Elementwise(bytes_per_thread=...) needs the kernel's first pointer "
                            f"parameter to declare its element type (e.g. const float*); use items_per_thread=")
        itemsize = getattr(torch, first.dtypes[0]).itemsize
        return max(1, self.bytes_per_thread // itemsize)
