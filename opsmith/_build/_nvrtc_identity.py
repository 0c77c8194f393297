"""Which NVRTC compiles here, named so that the name travels between machines.

An NVRTC cache key names the library by what it is: its version and the identity of its
file's content, never where it lies or when it was installed. Nodes that installed the same
NVRTC separately (a ``pip install`` per node, another prefix, another day) share kernels
through the shared cache; a different build of the same version (another patch release) does
not.

The content's identity is the ELF build ID (``.note.gnu.build-id``: a hash of the library's
contents that the linker writes into it; NVIDIA's libnvrtc has one) with the file size,
read in ~0.04 ms; a file without one is hashed whole (sha256: ~0.1 s for the 141 MB of NVRTC
13.5, measured). Hashing it in every process with a cold cache would cost a remote hit that
much (the NVRTC row of bench/bench_redis.py: 19 ms, then 122 ms with sha256 of the file).

Finding it costs loading libnvrtc (to ask its version and see which file the loader mapped).
That is done once per machine and library file: the machine-local state
(``records/nvrtc/identity.json``) keeps the answer with the file's stamp
(:mod:`opsmith._cache._stamps`), so a warm process stats one file and leaves libnvrtc
unloaded. A rewritten file (another stamp) is identified again.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

from opsmith._config import on_reset
from opsmith._record import Record

__all__ = ["NvrtcIdentity", "content_id", "elf_build_id", "loaded_nvrtc_path", "nvrtc_identity"]

_identity: list = [None]  # this process's answer


class NvrtcIdentity(Record):
    """The NVRTC that compiles here: ``version`` (``"13.5"``) and ``content``, the identity of
    its library file's bytes (``"build-id:<hex>:<size>"`` or ``"sha256:<hex>"``; None where the
    file is unknown). ``path`` is for messages only, never in a key."""

    __slots__ = ("content", "path", "version")


def loaded_nvrtc_path() -> str | None:
    """The file of the libnvrtc mapped into this process (Linux), else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if "/libnvrtc.so" in path or "/libnvrtc64" in path:
                    return path
    except OSError:
        pass
    return None


def elf_build_id(path: str) -> str | None:
    """The GNU build ID of a 64-bit little-endian ELF file (hex), or None when it has none."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
                return None
            (phoff,) = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            if phentsize < 56 or phnum > 4096:
                return None
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(len(table) // phentsize):
                p_type, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, i * phentsize)
                if p_type != 4 or size > 1 << 16:  # PT_NOTE, of a sane size
                    continue
                f.seek(offset)
                notes = f.read(size)
                pos = 0
                while pos + 12 <= len(notes):
                    namesz, descsz, kind = struct.unpack_from("<III", notes, pos)
                    pos += 12
                    name = notes[pos:pos + namesz]
                    pos += (namesz + 3) & ~3
                    desc = notes[pos:pos + descsz]
                    pos += (descsz + 3) & ~3
                    if kind == 3 and name.rstrip(b"\0") == b"GNU" and len(desc) >= 8:  # NT_GNU_BUILD_ID
                        return desc.hex()
    except (OSError, struct.error):
        pass
    return None


def content_id(path: str, size: int) -> str | None:
    """``build-id:<hex>:<size>`` where the ELF file has a build ID, else ``sha256:<hex>`` of its
    bytes; None when it cannot be read."""
    build_id = elf_build_id(path)
    if build_id is not None:
        return f"build-id:{build_id}:{size}"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return f"sha256:{h.hexdigest()}"


def nvrtc_identity(state, version: Callable[[], str]) -> NvrtcIdentity:
    """The identity of the NVRTC that compiles here, cheaply.

    Parameters
    ----------
    state : State or None
        The machine-local state that remembers it (None: computed in each process).
    version : callable
        Loads libnvrtc and returns its version; called only when the remembered answer is
        missing or its file changed.
    """
    if _identity[0] is not None:
        return _identity[0]

    def probe() -> dict:
        v = version()
        path = loaded_nvrtc_path()
        doc = {"version": v, "path": path, "stamp": None, "content": None}
        if path is not None:
            from opsmith._cache._stamps import stamp
            try:
                doc["stamp"] = stamp(path)  # before reading: a file replaced meanwhile is seen next time
            except OSError:
                return doc
            doc["content"] = content_id(path, doc["stamp"][0])
        return doc

    from opsmith._cache._stamps import unchanged
    from opsmith._cache._state import memo
    doc = memo(state, "nvrtc", "identity", probe,
               valid=lambda d: bool(d["content"]) and unchanged(d["path"], d["stamp"]))
    _identity[0] = NvrtcIdentity(version=doc["version"], content=doc["content"], path=doc["path"])
    return _identity[0]


def _forget() -> None:
    _identity[0] = None


on_reset(_forget)
