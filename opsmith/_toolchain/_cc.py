"""The C compiler: ``.c`` sources of targets that compile C as C (not torch extensions).

Found and fingerprinted like the C++ compiler (:mod:`._cxx`): ``CC`` if set, else the C
driver of the C++ compiler's family; nothing runs at import.
"""
from __future__ import annotations

import os

from opsmith._config import settings
from opsmith._errors import ToolchainError
from opsmith._toolchain._cxx import Compiler, _which, probe_compiler

__all__ = ["find_cc"]

# The C compiler of each C++ compiler family, by the name its driver goes by.
_C_DRIVERS = (("clang++", "clang"), ("g++", "gcc"), ("c++", "cc"))
_C_BY_FAMILY = {"clang": ("clang", "cc", "gcc"), "gcc": ("gcc", "cc", "clang")}


def find_cc(cxx: Compiler, state=None) -> Compiler:
    """The C compiler for ``.c`` sources: ``CC`` if set, else the C driver of ``cxx``'s family.

    The C++ compiler's sibling comes first (``/opt/llvm/bin/clang++`` -> ``/opt/llvm/bin/clang``,
    ``x86_64-linux-gnu-g++-12`` -> ``x86_64-linux-gnu-gcc-12``), then ``clang``/``gcc`` of the
    same family on PATH, then ``cc``; the first of the C++ compiler's family wins (``cc`` may be
    another family's), so that C and C++ objects of one library come from one toolchain. Its
    fingerprint goes into the key of every C unit.
    """
    if settings.cc:
        path = _which(settings.cc, state)
        if path is None:
            raise ToolchainError(f"the C compiler {settings.cc!r} named by CC was not found on PATH. "
                                 f"Install it or point CC at an installed C compiler (e.g. CC=gcc).")
        return probe_compiler(path, state)
    paths = []
    head, base = os.path.split(cxx.path)
    for cxx_name, c_name in _C_DRIVERS:
        if cxx_name in base:
            sibling = os.path.join(head, base.replace(cxx_name, c_name, 1))
            if os.access(sibling, os.X_OK):
                paths.append(sibling)
            break
    paths += [p for p in (_which(c, state) for c in _C_BY_FAMILY.get(cxx.family, ("cc", "gcc", "clang"))) if p]
    other = None  # a C compiler of another family: used only when none of cxx's family is found
    for path in dict.fromkeys(paths):
        comp = probe_compiler(path, state)
        if comp.family == cxx.family:
            return comp
        other = other or comp
    if other is not None:
        return other
    raise ToolchainError(
        f"no C compiler found for the .c sources (looked for the sibling of {cxx.path}, then cc, gcc "
        f"and clang on PATH). Install one (`apt-get install gcc` or `apt-get install clang`) or set "
        f"CC to a C compiler.")
