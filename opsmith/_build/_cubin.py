"""Static resources of the kernels in a cubin, read from its ELF without a GPU.

A cubin is an ELF64 file. For each kernel symbol ``S`` it holds ``.text.S`` (the code),
``.nv.shared.S`` (static ``__shared__`` data, a NOBITS section: its size is the bytes) and
entries in the ``.nv.info`` section: ``EIATTR_REGCOUNT`` (symbol index, registers) and
``EIATTR_FRAME_SIZE`` (symbol index, bytes of local memory per thread). The driver's
``cuFuncGetAttribute`` gives the same numbers on a GPU; this reader lets ``export-c`` put
them in its manifest on a machine without one. On sm_90 and newer the ``.nv.shared``
section of a kernel that uses shared memory also counts 1 KiB the compiler reserves, so
``shared_bytes`` can be the driver's figure plus 1024.
"""
from __future__ import annotations

import struct

__all__ = ["kernel_resources"]

_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
_EIFMT_SVAL, _EIFMT_HVAL, _EIFMT_BVAL = 4, 3, 2
_SECTION = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, align, entsize
_SYMBOL = struct.Struct("<IBBHQQ")  # name, info, other, shndx, value, size


def kernel_resources(cubin: bytes) -> dict[str, dict[str, int]]:
    """``{symbol: {"registers": n, "shared_bytes": n, "local_bytes": n}}`` for each kernel.

    Returns an empty dict for data that is no ELF64 cubin (PTX text, say).

    Examples
    --------
    >>> kernel_resources(b".version 8.0")
    {}
    """
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        return {}
    try:
        return _read(cubin)
    except (struct.error, IndexError, ValueError):
        return {}  # a layout this reader does not know: the manifest leaves the numbers out


def _read(d: bytes) -> dict[str, dict[str, int]]:
    (shoff,) = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    secs = [_SECTION.unpack_from(d, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = secs[shstrndx][4]

    def cstr(off: int) -> str:
        return d[off:d.index(b"\0", off)].decode("utf-8", "replace")

    names = [cstr(strtab_off + s[0]) for s in secs]
    symtab = next((s for n, s in zip(names, secs) if n == ".symtab"), None)
    sym_names: list[str] = []
    if symtab is not None:
        str_off = secs[symtab[6]][4]
        for i in range(symtab[5] // _SYMBOL.size):
            sym_names.append(cstr(str_off + _SYMBOL.unpack_from(d, symtab[4] + i * _SYMBOL.size)[0]))
    out: dict[str, dict[str, int]] = {}
    for name in names:
        if name.startswith(".text."):
            out[name[6:]] = {"registers": 0, "shared_bytes": 0, "local_bytes": 0}
    for name, s in zip(names, secs):
        if name.startswith(".nv.shared.") and name[11:] in out:
            out[name[11:]]["shared_bytes"] = s[5]
        elif name == ".nv.info":
            for attr, value in _info_entries(d, s[4], s[5]):
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(value) == 8:
                    sym, n = struct.unpack("<II", value)
                    kernel = sym_names[sym] if sym < len(sym_names) else None
                    if kernel in out:
                        out[kernel]["registers" if attr == _EIATTR_REGCOUNT else "local_bytes"] = n
    return out


def _info_entries(d: bytes, off: int, size: int):
    """(attribute, value bytes) of each entry of an ``.nv.info`` section."""
    p, end = off, off + size
    while p + 2 <= end:
        fmt, attr = d[p], d[p + 1]
        if fmt == _EIFMT_SVAL:
            (n,) = struct.unpack_from("<H", d, p + 2)
            yield attr, d[p + 4:p + 4 + n]
            p += 4 + n
        elif fmt in (_EIFMT_HVAL, _EIFMT_BVAL):
            yield attr, d[p + 2:p + 4]
            p += 4
        else:
            p += 2
