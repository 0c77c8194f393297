"""Which C++ runtime a compiler links into shared objects.

A C++ shared object that carries its own copy of libstdc++ (linked from ``libstdc++.a``) runs
beside the process's ``libstdc++.so.6`` (loaded by Python, torch and every other C++ library):
two C++ runtimes in one process. Locale facets, ``iostream`` state and exception types are not
shared between them, so ``std::ostringstream << 5`` writes nothing in one process and
segfaults in another (seen on a GPU machine whose ``g++`` wrapper finds only ``libstdc++.a``;
every torch extension it built, and every ``TORCH_CHECK`` message with a number in it, was hit).

A compiler links the archive when its own ``libstdc++.so`` is missing (``g++
-print-file-name=libstdc++.so`` answers the bare name) while ``libstdc++.a`` is there. For
such a compiler :func:`shared_runtime` names the shared ``libstdc++.so.6`` to link instead:
the one this process runs (``/proc/self/maps``), else the compiler's ``libstdc++.so.6``;
linked as an input file, it resolves every C++ runtime symbol before the archive is read.
"""
from __future__ import annotations

import os
import subprocess

from opsmith._cache._keys import KeyBuilder
from opsmith._cache._stamps import stamp_of
from opsmith._cache._state import memo
from opsmith._errors import ToolchainError

__all__ = ["links_static_runtime", "shared_runtime"]

_RECORD_NS = "toolchain"


def _print_file_name(path: str, name: str) -> str | None:
    """The compiler's path for library ``name``; None when it has none (it answers the bare name)."""
    try:
        out = subprocess.run([path, f"-print-file-name={name}"], capture_output=True, text=True, timeout=60,
                             check=False, stdin=subprocess.DEVNULL, env=dict(os.environ, LC_ALL="C")).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"the compiler {path} could not be run ({exc}). Reinstall it or set CXX "
                             f"to a working compiler.") from None
    return out if os.sep in out and os.path.exists(out) else None


def _probe(path: str) -> dict:
    return {"static": _print_file_name(path, "libstdc++.so") is None
            and _print_file_name(path, "libstdc++.a") is not None,
            "shared6": _print_file_name(path, "libstdc++.so.6")}


def links_static_runtime(comp, state=None) -> bool:
    """True when ``comp`` (a :class:`~opsmith._toolchain._cxx.Compiler`) would link libstdc++
    statically into shared objects (memoized per compiler binary, on disk)."""
    return bool(_probed(comp, state)["static"])


def _probed(comp, state) -> dict:
    try:
        st = os.stat(comp.path)
    except OSError:
        raise ToolchainError(f"the compiler {comp.path} cannot be read. Reinstall it or set CXX.") from None
    ident = KeyBuilder("libstdcxx-probe").str("path", comp.path).str("real", os.path.realpath(comp.path)).str(
        "stat", repr(stamp_of(st))).str("fingerprint", comp.fingerprint).hexdigest()
    return memo(state, _RECORD_NS, "cxx-libstdcxx-" + ident, lambda: _probe(comp.path),
                valid=lambda d: isinstance(d, dict) and isinstance(d.get("static"), bool))


def _loaded_runtime() -> str | None:
    """The libstdc++.so.6 this process has mapped (Linux), if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libstdc++.so") and os.path.exists(path):
                    return path
    except OSError:
        return None
    return None


def shared_runtime(comp, state=None) -> str | None:
    """The ``libstdc++.so.6`` to link into a C++ shared object built by ``comp``, or None when
    the compiler links the shared one itself. Raises when it would link the archive and no
    shared runtime is to be found."""
    probed = _probed(comp, state)
    if not probed["static"]:
        return None
    found = _loaded_runtime() or probed.get("shared6")
    if found is None:
        raise ToolchainError(
            f"the compiler {comp.path} links libstdc++ statically into shared objects (it has libstdc++.a "
            f"but no libstdc++.so), and no shared libstdc++.so.6 was found to link instead: a module with "
            f"its own C++ runtime misbehaves next to the process's (iostreams print nothing or crash). "
            f"Point CXX at a compiler with a shared libstdc++, or install the libstdc++ development "
            f"package (Debian/Ubuntu: libstdc++-<version>-dev)")
    return found
