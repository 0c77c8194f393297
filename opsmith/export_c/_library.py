"""How an export's library is built: ``lib<prefix>.a`` and ``lib<prefix>.so`` from its ``<prefix>.c``.

Through the engine, with the ``shared-library`` profile (ninja, cached objects, progress,
diagnostics): the ``.c`` is compiled as C by the C compiler with :data:`CFLAGS`, once for both
libraries (one unit, one key); the archive is ``ar`` of it, the shared library links it with
:data:`LDFLAGS`. The built files are copied from the cache into the export's folder.
"""
from __future__ import annotations

import os
import shutil
from contextlib import nullcontext
from pathlib import Path

from opsmith._errors import ToolchainError

__all__ = ["build_c_library", "CFLAGS", "LDFLAGS"]

#: The generated C's flags: plain C99 (the code's promise), and only the API exported from the
#: shared library (its functions say so; every other name is static or hidden). The profile adds -fPIC.
CFLAGS = ("-std=c99", "-O2", "-fvisibility=hidden")
#: Link flags of the shared library beyond the profile's ``-shared``; the soname is added per library.
#: libdl and libpthread for glibc older than 2.34; --as-needed drops them where libc has both.
LDFLAGS = ("-Wl,--as-needed", "-ldl", "-lpthread")


def build_c_library(source: str | os.PathLike, out_dir: str | os.PathLike, name: str, *,
                    static: bool = True, shared: bool = True, cc: str | None = None) -> dict[str, Path]:
    """Build ``lib<name>.a`` and/or ``lib<name>.so`` in ``out_dir`` from a generated ``.c``; cached.

    ``cc``: the C compiler (default: ``CC``, else the C++ compiler's C sibling, as for every C
    unit the engine builds). The shared library exports only the API (``-fvisibility=hidden``)
    and needs no libcuda (``readelf -d``). Returns ``{"static": path, "shared": path}`` for
    those built.

    Examples
    --------
    >>> build_c_library("out/ex.c", "out", "ex")    # doctest: +SKIP
    {'static': PosixPath('out/libex.a'), 'shared': PosixPath('out/libex.so')}
    """
    from opsmith._build._profile_shared import build_shared_library, build_static_library
    from opsmith._config import settings
    if cc is not None and shutil.which(cc) is None:
        raise ToolchainError(f"no C compiler named {cc!r} on PATH to build the library: install gcc "
                             f"(apt-get install gcc), pass cc=, or build {source} yourself")
    out = Path(out_dir)
    results: dict[str, Path] = {}
    with settings.override(cc=cc) if cc is not None else nullcontext():
        if static:
            art = build_static_library(name, [os.fspath(source)], extra_cflags=list(CFLAGS))
            results["static"] = _copy(art.path, out / f"lib{name}.a", 0o644)
        if shared:
            art = build_shared_library(name, [os.fspath(source)], extra_cflags=list(CFLAGS), with_cuda=False,
                                       extra_ldflags=[f"-Wl,-soname,lib{name}.so", *LDFLAGS])
            results["shared"] = _copy(art.path, out / f"lib{name}.so", 0o755)
    return results


def _copy(built: Path, dest: Path, mode: int) -> Path:
    """``built`` (inside its cache entry) to ``dest``, atomically (a temporary name, then ``os.replace``)."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.copyfile(built, tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, dest)
    return dest
