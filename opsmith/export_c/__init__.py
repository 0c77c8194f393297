"""The export-c target: CUDA kernels to a C library with the code inside (``opsmith export-c``).

Everything export-c owns lives here: :func:`export_c` and :class:`CExport` (``_export``), the
public header's template and the manifest (``_generate``, ``templates/export_c.h``), how its
library is built (``_library``) and its command (``_cli``; :mod:`opsmith.cli` holds the argparse
wiring). It uses the core only: the launch unit and the per-arch NVRTC compiles
(``opsmith._build._launch_unit``, ``_archs_compile``) and the launch core's C
(``opsmith._runtime._launch_gen``, ``opsmith/_runtime/launch/``). See docs/export_c.md.

``opsmith.export_c`` is both this package and the function: calling the package calls
:func:`export_c`, so ``opsmith.export_c(...)`` works whichever of the two the name holds.

Examples
--------
>>> import opsmith
>>> e = opsmith.export_c("relu.cu", ["relu"], out_dir="out", archs=["sm_90"])  # doctest: +SKIP
"""
from __future__ import annotations

import sys
import types

from opsmith._build._archs_compile import COMMON_ARCHS, default_archs
from opsmith._runtime._launch_gen import embed_literal
from opsmith.export_c._export import CExport, export_c
from opsmith.export_c._library import build_c_library

__all__ = ["export_c", "CExport", "default_archs", "build_c_library", "embed_literal", "COMMON_ARCHS"]


class _CallablePackage(types.ModuleType):
    """The package's module type: ``opsmith.export_c(...)`` is :func:`export_c` (importing the
    package binds the name ``export_c`` of ``opsmith`` to it)."""

    def __call__(self, *args, **kwargs):
        return export_c(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
