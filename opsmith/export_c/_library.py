"""How an export's library is built: ``lib<prefix>.a`` and ``lib<prefix>.so`` from its ``<prefix>.c``."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from opsmith._build._run import run_tool
from opsmith._errors import ToolchainError

__all__ = ["build_c_library"]


def build_c_library(source: str | os.PathLike, out_dir: str | os.PathLike, name: str, *,
                    static: bool = True, shared: bool = True, cc: str | None = None) -> dict[str, Path]:
    """Compile a generated ``.c`` into ``lib<name>.a`` and/or ``lib<name>.so`` with the system C compiler.

    ``cc``: the compiler (default: ``cc``, ``gcc`` or ``clang`` on PATH). The shared library
    exports only the API (``-fvisibility=hidden``) and needs no libcuda (``readelf -d``).
    """
    compiler = cc or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None or shutil.which(compiler) is None:
        raise ToolchainError(f"no C compiler {'named ' + repr(cc) if cc else '(cc, gcc or clang)'} on PATH to "
                             f"build the library: install gcc (apt-get install gcc), pass cc=, or build "
                             f"{source} yourself")
    out = Path(out_dir)
    obj = out / f"{name}.o"
    results: dict[str, Path] = {}
    _run([compiler, "-std=c99", "-O2", "-fPIC", "-fvisibility=hidden", "-c", os.fspath(source), "-o", str(obj)],
         source)
    try:
        if static:
            lib = out / f"lib{name}.a"
            lib.unlink(missing_ok=True)
            _run([shutil.which("ar") or "ar", "rcs", str(lib), str(obj)], source)
            results["static"] = lib
        if shared:
            lib = out / f"lib{name}.so"
            _run([compiler, "-shared", "-o", str(lib), str(obj), f"-Wl,-soname,lib{name}.so",
                  "-Wl,--as-needed", "-ldl", "-lpthread"], source)
            results["shared"] = lib
    finally:
        obj.unlink(missing_ok=True)
    return results


def _run(cmd: list[str], source) -> None:
    run_tool(cmd, source, "the exported library")
