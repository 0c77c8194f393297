"""``export_c``: CUDA kernels to a C library that needs no Python, torch or libcuda at link time.

Data flow::

    sources + kernel names + archs
        -> a launch unit (opsmith._build._launch_unit: one NVRTC compile per (source, arch),
           cached; a KernelSignature per kernel; the launch core's C filled in)
    ->  <prefix>.h     templates/export_c.h around the launch core's API (opsmith.export_c._generate)
        <prefix>.c     the launch core's source: every image embedded, a per-arch table picked at load
        <prefix>.json  the manifest: kernels, signatures, archs, static resources, cache keys
        lib<prefix>.a / lib<prefix>.so   when asked (opsmith.export_c._library)
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opsmith._errors import SpecError
from opsmith._record import Record

__all__ = ["export_c", "CExport"]

log = logging.getLogger("opsmith.export_c")


class CExport(Record):
    """What :func:`export_c` wrote.

    ``header``, ``source``, ``manifest`` are paths; ``static_library`` and ``shared_library``
    are paths or None; ``kernels`` maps each kernel's name (``"scale<float>"``) to its launch
    function (``"opsmith_mylib_scale_float_launch"``); ``archs`` lists the embedded code
    (``"sm_90"``, ``"compute_120"`` for PTX); ``seconds`` the time of each step.
    """

    __slots__ = ("header", "source", "manifest", "static_library", "shared_library", "kernels", "archs",
                 "seconds")


def export_c(sources: str | os.PathLike | Sequence[str | os.PathLike], kernels: Sequence[str] | None = None, *,
             out_dir: str | os.PathLike, prefix: str | None = None, archs: Iterable[str | int] | None = None,
             ptx: bool = True, library: str | None = None, cc: str | None = None,
             include_paths: Iterable[str | os.PathLike] = (),
             defines: Mapping[str, Any] | Iterable[str] | None = None,
             headers: Mapping[str, str] | None = None, options: Iterable[str] = (),
             std: str | None = "c++17") -> CExport:
    """Export CUDA kernels as a C library: a header, a source with the code embedded, a manifest.

    Parameters
    ----------
    sources : str, path-like or a list of them
        ``.cu`` files or CUDA C++ text.
    kernels : list of str, optional
        Kernel names or name expressions (``"scale<float>"``); ``"alias=scale<float>"`` names
        the C functions. Default: every kernel that is not a template.
    out_dir : path-like
        Where ``<prefix>.h``, ``<prefix>.c`` and ``<prefix>.json`` (and the libraries) go.
    prefix : str, optional
        The C prefix: functions are ``opsmith_<prefix>_<kernel>_launch``. Default: the first
        file's stem, else ``"kernels"``.
    archs : list of str, optional
        ``["sm_80", "sm_90"]``. Default: :func:`~opsmith.export_c.default_archs`.
    ptx : bool
        Also embed PTX of the newest arch, which the driver compiles for newer GPUs (default).
    library : {None, "static", "shared", "both"}
        Also build ``lib<prefix>.a`` and/or ``lib<prefix>.so`` (see
        :func:`~opsmith.export_c.build_c_library`; ``cc`` names the C compiler).
    include_paths, defines, headers, options, std
        As for :func:`opsmith.compile_cuda`.

    Returns
    -------
    CExport

    Examples
    --------
    >>> e = opsmith.export_c("relu.cu", ["relu"], out_dir="out", archs=["sm_90"])  # doctest: +SKIP
    >>> e.kernels                                                                # doctest: +SKIP
    {'relu': 'opsmith_relu_relu_launch'}
    """
    from opsmith._build._launch_unit import build_launch_unit
    from opsmith.export_c._generate import manifest, public_header
    from opsmith.export_c._library import build_c_library
    if library not in (None, "static", "shared", "both"):
        raise SpecError(f"library must be 'static', 'shared', 'both' or None, got {library!r}")
    unit = build_launch_unit(sources, kernels, prefix=prefix, archs=archs, ptx=ptx, tool="`opsmith export-c`",
                             include_paths=include_paths, defines=defines, headers=headers, options=options,
                             std=std)
    t2 = time.perf_counter()
    prefix = unit.prefix
    out = Path(out_dir)
    paths = {"header": out / f"{prefix}.h", "source": out / f"{prefix}.c", "manifest": out / f"{prefix}.json"}
    header = public_header(unit)
    data = manifest(unit, paths["header"].name, paths["source"].name)
    t3 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    _write(paths["header"], header)
    _write(paths["source"], unit.code.source)
    _write(paths["manifest"], json.dumps(data, indent=1) + "\n")
    t4 = time.perf_counter()
    libs: dict[str, Path] = {}
    if library is not None:
        libs = build_c_library(paths["source"], out, prefix, static=library in ("static", "both"),
                               shared=library in ("shared", "both"), cc=cc)
    t5 = time.perf_counter()
    steps = unit.seconds
    seconds = {"parse": steps["parse"], "compile": steps["compile"], "generate": steps["generate"] + t3 - t2,
               "write": t4 - t3, "library": t5 - t4}
    seconds["total"] = sum(seconds.values())
    archs_named = tuple(a["arch"] for a in data["archs"])
    log.info("exported %d kernels for %s in %.2f s", len(unit.kernels), ", ".join(archs_named), seconds["total"])
    return CExport(header=paths["header"], source=paths["source"], manifest=paths["manifest"],
                   static_library=libs.get("static"), shared_library=libs.get("shared"),
                   kernels=dict(unit.code.launchers), archs=archs_named, seconds=seconds)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
