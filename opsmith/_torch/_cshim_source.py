"""The C-shim op library's source (see :mod:`opsmith._torch._cshim`) and what Python reads from it.

The source is a real C++ file, ``opsmith/_torch/cshim/osm_cshim.cpp``, shipped as package data
and read through :mod:`importlib.resources`. It is the one place that says how many op slots,
kernels, parameters, devices and tensors the library holds (``#define OSM_MAX_*``) and in which
order :c:func:`osm_init` takes the torch shim and driver functions (the ``OSM_API`` list):
:func:`read` parses both from the file, so Python's checks and the function table it passes
cannot disagree with the compiled library.

Examples
--------
>>> from opsmith._torch import _cshim_source
>>> src = _cshim_source.read()
>>> src.max_ops, src.api_names[0]
(64, 'aoti_torch_library_init_impl')
"""
from __future__ import annotations

import functools
import re
from importlib import resources
from typing import NamedTuple

from opsmith._errors import OpsmithError

__all__ = ["CShimSource", "read", "parse", "PACKAGE", "RESOURCE"]

#: Where the source lies: ``importlib.resources.files(PACKAGE).joinpath(RESOURCE)``.
PACKAGE, RESOURCE = "opsmith._torch", "cshim/osm_cshim.cpp"
_LIMIT = re.compile(r"^#define OSM_MAX_(OPS|KERNELS|PARAMS|DEVICES|TENSORS)\s+(\d+)\b", re.MULTILINE)
_API_BLOCK = re.compile(r"^#define OSM_API\(X\)((?:.*\\\n)*.*)$", re.MULTILINE)
_API_ENTRY = re.compile(r"\bX\(\s*\w+\s*,\s*(\w+)\s*,")


class CShimSource(NamedTuple):  # not a frozen dataclass: ~1 ms less at import, on a package's path
    """The library's C++ ``text`` and what it declares: the ``max_*`` limits and ``api_names``,
    the symbols of the function table :c:func:`osm_init` receives, in its order."""

    text: str
    max_ops: int
    max_kernels: int
    max_params: int
    max_devices: int
    max_tensors: int
    api_names: tuple[str, ...]

    def __repr__(self) -> str:
        return (f"CShimSource({RESOURCE}: max_ops={self.max_ops}, max_kernels={self.max_kernels}, "
                f"max_params={self.max_params}, max_devices={self.max_devices}, "
                f"max_tensors={self.max_tensors}, {len(self.api_names)} API functions)")


def _broken(what: str) -> OpsmithError:
    return OpsmithError(f"the C-shim source {PACKAGE}/{RESOURCE} {what}; reinstall opsmith, or set "
                        f"OPSMITH_TORCH_OP_CSHIM=0 to use the Python implementation of ops")


def parse(text: str) -> CShimSource:
    """The limits and the API order that ``text`` (the library's C++) declares."""
    limits = {name.lower(): int(value) for name, value in _LIMIT.findall(text)}
    missing = [n for n in ("ops", "kernels", "params", "devices", "tensors") if n not in limits]
    if missing:
        raise _broken(f"defines no OSM_MAX_{missing[0].upper()}")
    block = _API_BLOCK.search(text)
    names = tuple(_API_ENTRY.findall(block.group(1))) if block else ()
    if not names:
        raise _broken("has no OSM_API(X) list")
    return CShimSource(text=text, api_names=names, **{f"max_{k}": v for k, v in limits.items()})


@functools.cache
def read() -> CShimSource:
    """The packaged source, read and parsed once per process."""
    try:
        text = resources.files(PACKAGE).joinpath(RESOURCE).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _broken("is missing") from None
    return parse(text)
