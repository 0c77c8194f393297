"""Link stubs: stand-ins for torch's shared libraries that carry their names and nothing else.

Linking an extension against ``libtorch_cpu.so`` makes the linker read its symbol tables
(the library is over 400 MB), about 0.3 s of every build, to learn nothing: a shared object
may leave symbols undefined, and the loader binds them when the module is imported, against
the torch libraries already in the process. A stub with the same ``SONAME`` gives the
artifact the same ``DT_NEEDED`` entries for a fraction of that.

The stubs are a store entry, keyed by the compiler and torch; each is checked to carry its
library's ``SONAME``. Executables, and link flags that forbid undefined symbols
(``-z defs``, ``--no-undefined``), link against the real libraries, as does
``OPSMITH_LINK_STUBS=0``.
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
from pathlib import Path

from opsmith._config import settings
from opsmith._cache._keys import KeyBuilder
from opsmith._cache._open import Cache
from opsmith._toolchain._cxx import Compiler, TorchInfo

__all__ = ["TORCH_LIBS", "wanted", "link_flags", "ensure", "elf_soname"]

log = logging.getLogger("opsmith.build")

TORCH_LIBS = ("c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python")
_STRICT = ("defs", "no-undefined", "no-allow-shlib-undefined")


def wanted(kind: str, ldflags: list[str]) -> bool:
    """Whether a link of ``kind`` with ``ldflags`` may use stubs (part of the link key)."""
    return (kind != "executable" and settings.link_stubs
            and not any(s in f for f in ldflags for s in _STRICT))


def link_flags(cache: Cache, cxx: Compiler, torch: TorchInfo, kind: str,
               ldflags: list[str]) -> list[str]:
    """``ldflags`` with each torch ``-lNAME`` replaced by its stub; unchanged when none applies."""
    if not wanted(kind, ldflags):
        return ldflags
    stubs = ensure(cache, cxx, torch)
    if not stubs:
        return ldflags
    out: list[str] = []
    for f in ldflags:
        name = f[2:] if f.startswith("-l") else None
        if name in stubs:
            # --no-as-needed: a stub defines no symbol, and an as-needed link would drop it.
            out += ["-Wl,--push-state,--no-as-needed", os.fspath(stubs[name]), "-Wl,--pop-state"]
        else:
            out.append(f)
    return out


def _key(cxx: Compiler, torch: TorchInfo) -> str:
    return KeyBuilder("link-stubs").str("compiler", cxx.fingerprint).str("torch", torch.fingerprint) \
        .strs("libs", TORCH_LIBS).hexdigest()


def ensure(cache: Cache, cxx: Compiler, torch: TorchInfo) -> dict[str, Path]:
    """The stubs entry's files by library name, built on first use; {} when they cannot be."""
    key = _key(cxx, torch)
    entry = cache.store.get(key)
    if entry is None:
        entry = _build(cache, key, cxx, torch)
        if entry is None:
            return {}
    return {n: entry.file(f"lib{n}.so") for n in TORCH_LIBS if f"lib{n}.so" in entry.manifest["files"]}


def _build(cache: Cache, key: str, cxx: Compiler, torch: TorchInfo):
    build_dir = cache.workspace.build_dir("link-stubs")
    try:
        files, sonames = {}, {}
        for name in TORCH_LIBS:
            real = Path(torch.lib_dir) / f"lib{name}.so"
            if not real.exists():
                continue
            soname = elf_soname(real)
            if soname is None:
                log.info("no SONAME found in %s: linking against the real torch libraries", real)
                return None
            out = build_dir / real.name
            cmd = [cxx.path, "-shared", "-nostdlib", f"-Wl,-soname,{soname}", "-x", "c++", os.devnull,
                   "-o", os.fspath(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
            if proc.returncode != 0 or elf_soname(out) != soname:
                log.info("link stub for %s not built (%s): linking against the real torch libraries",
                         real.name, (proc.stderr or "wrong SONAME").strip()[-300:])
                return None
            files[real.name], sonames[real.name] = out, soname
        if not files:
            return None
        return cache.store.put(key, files, kind="link-stubs", name="torch link stubs", move=True,
                         meta={"sonames": sonames, "lib_dir": os.fspath(torch.lib_dir)})
    except OSError as exc:
        log.info("link stubs not built (%s): linking against the real torch libraries", exc)
        return None
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


def elf_soname(path: str | os.PathLike) -> str | None:
    """The ``DT_SONAME`` of a 64-bit little-endian ELF shared object, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        loads, dynamic = [], None
        for i in range(phnum):
            if (i + 1) * phentsize > len(table) or phentsize < 56:
                return None
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
            if p_type == 1:  # PT_LOAD
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return None
        f.seek(dynamic[0])
        data = f.read(dynamic[1])
        strtab = soname = None
        for off in range(0, len(data) - 15, 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:  # DT_NULL
                break
            if tag == 5:  # DT_STRTAB (an address)
                strtab = val
            elif tag == 14:  # DT_SONAME (an offset into the string table)
                soname = val
        if strtab is None or soname is None:
            return None
        for vaddr, offset, size in loads:
            if vaddr <= strtab < vaddr + size:
                f.seek(offset + (strtab - vaddr) + soname)
                raw = f.read(4096).split(b"\0", 1)[0]
                return raw.decode("utf-8", "replace") or None
    return None
