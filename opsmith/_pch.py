"""Precompiled torch headers: built once per toolchain and flags, shared by every extension.

Parsing ``torch/extension.h`` is most of a torch extension's compile time (about 20–30 s
on a 2-core machine). A precompiled header removes it: clang's with
``-fpch-instantiate-templates`` (template instantiations done once, in the PCH) is the
fastest; gcc's ``.gch`` works too. The PCH is a store entry like any other: keyed by the
compiler fingerprint, the exact flags, torch's fingerprint and the header text; built under
its own lock; verified when used.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from ._errors import ToolchainError
from ._keys import KeyBuilder
from ._store import LocalStore
from ._toolchain import Compiler, TorchInfo

__all__ = ["Pch", "pch_key", "ensure_pch", "pch_flags"]

log = logging.getLogger("opsmith.build")

HEADER_TEXT = "#include <torch/extension.h>\n"
_HEADER = "torch_extension_pch.h"


@dataclasses.dataclass(frozen=True)
class Pch:
    key: str
    use_flags: tuple[str, ...]
    built_seconds: float | None  # None when it came from the cache


def supported(compiler: Compiler) -> bool:
    return compiler.family in ("gcc", "clang")


def pch_key(compiler: Compiler, torch: TorchInfo, flags: list[str]) -> str:
    return (KeyBuilder("pch").str("compiler", compiler.fingerprint).str("torch", torch.fingerprint)
            .strs("flags", flags).str("header", HEADER_TEXT).hexdigest())


def _stable_header(store: LocalStore) -> Path:
    """The header the PCH is built from, at a path that never changes (clang records it)."""
    d = store.root / "pch-src"
    d.mkdir(mode=0o700, exist_ok=True)
    path = d / _HEADER
    if not path.exists():
        tmp = d / f".{_HEADER}.{os.getpid()}"
        tmp.write_text(HEADER_TEXT)
        try:
            os.link(tmp, path)  # never replace an existing one: clang checks its mtime
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path


def pch_flags(compiler: Compiler, entry_dir: Path) -> tuple[str, ...]:
    if compiler.family == "clang":
        return ("-include-pch", os.fspath(entry_dir / "torch.pch"))
    return ("-include", os.fspath(entry_dir / _HEADER), "-Winvalid-pch")


def ensure_pch(store: LocalStore, compiler: Compiler, torch: TorchInfo, flags: list[str],
               on_status=None) -> Pch | None:
    """The PCH for ``flags``, built if needed. None (with a log line) when it cannot be built."""
    key = pch_key(compiler, torch, flags)
    # Fully verified like every entry (sha256 of ~170 MB: ~0.16 s of a cold build): a flipped
    # bit in a PCH could otherwise compile into a silently wrong binary.
    entry = store.get(key)
    if entry is None:
        with store.lock(key):
            entry = store.get(key)
            if entry is None:
                if on_status:
                    on_status("precompiling torch headers (once per toolchain and flags)")
                entry, seconds = _build(store, key, compiler, flags)
                if entry is None:
                    return None
                return Pch(key, pch_flags(compiler, entry.path), seconds)
    return Pch(key, pch_flags(compiler, entry.path), None)


def _build(store: LocalStore, key: str, compiler: Compiler, flags: list[str]):
    header = _stable_header(store)
    build_dir = store.new_build_dir("pch")
    try:
        if compiler.family == "clang":
            out = build_dir / "torch.pch"
            cmd = [compiler.path, *flags, "-x", "c++-header", os.fspath(header),
                   "-fpch-instantiate-templates", "-o", os.fspath(out)]
            files = {"torch.pch": out}
        else:
            local_header = build_dir / _HEADER
            local_header.write_text(HEADER_TEXT)
            out = build_dir / (_HEADER + ".gch")
            cmd = [compiler.path, *flags, "-x", "c++-header", os.fspath(local_header), "-o", os.fspath(out)]
            files = {_HEADER: local_header, _HEADER + ".gch": out}
        log.info("building precompiled torch headers: %s", shlex.join(cmd))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            # Not fatal: the sources compile without it, only slower. The real error, if the
            # flags are wrong, shows when the user's own file is compiled.
            log.warning("precompiled torch headers failed to build; compiling without them.\n%s",
                        proc.stderr[-2000:])
            return None, seconds
        entry = store.put(key, files, kind="pch", name="torch/extension.h", move=True,
                          meta={"compiler": compiler.path, "seconds": round(seconds, 3)})
        return entry, seconds
    except FileNotFoundError as exc:
        raise ToolchainError(f"cannot run the compiler {compiler.path}: {exc}") from None
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
