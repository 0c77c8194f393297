"""The launch code of an ONNX Runtime library's CUDA kernels: C sources and headers to build with it.

Per CUDA module: a launch unit of the core (:mod:`opsmith._build._launch_unit`): its kernels
compiled by NVRTC for every arch (cached), embedded in the launch core's C, whose typed launch
functions open the driver at run time and launch on a given stream.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

from opsmith._record import Record

__all__ = ["LaunchCode", "launch_code"]


class LaunchCode(Record):
    """What the library's C++ needs to launch its kernels: ``files`` (file name -> text, all
    written beside the library's source), ``units`` (the file names compiled), ``headers``
    (the file names its C++ includes), ``launchers`` (kernel name expression -> launch
    function) and ``last_error`` (the function that says why a launch failed, or None)."""

    __slots__ = ("files", "units", "headers", "launchers", "last_error")


def _ident(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", s)


def launch_code(kernels_by_module: Mapping[int, Sequence[str]], cuda_sources: Sequence[dict], name: str,
                archs: Sequence[str] | None) -> LaunchCode:
    """The launch code of ``kernels_by_module`` (module index -> kernel name expressions)."""
    from opsmith._build._launch_unit import build_launch_unit
    files: dict[str, str] = {}
    units, headers, launchers = [], [], {}
    last_error = None
    for m, kernels in sorted(kernels_by_module.items()):
        prefix = f"{name}_k{m}"
        unit = build_launch_unit(**{"prefix": prefix, "archs": archs, "tool": "opsmith.onnx", **cuda_sources[m],
                                    "kernels": [f"{_ident(k)}={k}" for k in kernels]})
        launchers.update({k: unit.code.launchers[k] for k in kernels})
        files[f"{prefix}.h"] = unit.code.header
        files[f"{prefix}.c"] = unit.code.source
        units.append(f"{prefix}.c")
        headers.append(f"{prefix}.h")
        last_error = last_error or unit.code.last_error
    return LaunchCode(files=files, units=tuple(units), headers=tuple(headers), launchers=launchers,
                      last_error=last_error)
