"""What NVRTC is asked to compile: a canonical, hashable request, and its cache key.

``make_request`` turns user arguments (a source string or a ``.cu`` path, options, include
paths, defines, in-memory headers, name expressions, the arch) into a :class:`CompileRequest`;
``CompileRequest.key`` hashes everything that decides NVRTC's output: the source, every
reachable user header's bytes, the options, the arch and output kind, opsmith's version and
the identity of the NVRTC that compiles it (:mod:`opsmith._build._nvrtc_identity`).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsmith._cache._keys import KeyBuilder
from opsmith._errors import SpecError
from opsmith._record import Record
from opsmith._version import __version__

if TYPE_CHECKING:
    from opsmith._build._nvrtc_identity import NvrtcIdentity

__all__ = ["CompileRequest", "make_request", "normalize_arch"]


# -- arch -------------------------------------------------------------------------------------
_ARCH_RE = r"^(?:sm_|compute_|sm|compute)?(\d)\.?(\d+)([af]?)$"  # compiled on first use


def normalize_arch(arch: str | int) -> str:
    """``"sm_90"``, ``"90"``, ``"9.0"``, ``90`` or ``"compute_90"`` -> ``"sm_90"`` (``sm_90a`` kept).

    Examples
    --------
    >>> normalize_arch("9.0"), normalize_arch(80), normalize_arch("compute_90a")
    ('sm_90', 'sm_80', 'sm_90a')
    """
    if isinstance(arch, str) and arch.startswith("sm_") and arch[3:].isdigit() and len(arch) > 4:
        return arch  # the canonical form already (the warm path's case)
    text = str(arch).strip().lower()
    m = re.match(_ARCH_RE, text)
    if m is None:
        raise SpecError(f"cannot read the CUDA arch {arch!r}; write it as sm_90, 90 or 9.0 "
                        f"(OPSMITH_CUDA_ARCH takes the same forms).")
    return f"sm_{m.group(1)}{m.group(2)}{m.group(3)}"


# -- what to compile ----------------------------------------------------------------------------
_INCLUDE_RE = r'(?m)^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]'  # compiled on first use


class CompileRequest(Record):
    """Everything that decides NVRTC's output, in canonical form (immutable).

    ``name`` is the program name NVRTC prints in its log (the file path for a file).
    Fields: source, name, arch, output ("cubin"), std ("c++17"), options, include_paths,
    defines ((name, value) pairs), headers ((name, text) pairs), name_expressions, source_dir.
    """

    __slots__ = ("source", "name", "arch", "output", "std", "options", "include_paths", "defines",
                 "headers", "name_expressions", "source_dir")
    _defaults = {"output": "cubin", "std": "c++17", "options": (), "include_paths": (), "defines": (),
                 "headers": (), "name_expressions": (), "source_dir": None}

    def nvrtc_options(self) -> list[str]:
        arch = self.arch if self.output == "cubin" else self.arch.replace("sm_", "compute_")
        opts = [f"--gpu-architecture={arch}"]
        if self.std:
            opts.append(f"-std={self.std}")
        for inc in ((self.source_dir,) if self.source_dir else ()) + self.include_paths:
            opts.append(f"--include-path={inc}")
        for name, value in self.defines:
            opts.append(f"-D{name}" if value is None else f"-D{name}={value}")
        opts.extend(self.options)
        return opts

    def header_files(self) -> list[tuple[str, Path | None]]:
        """(name as included, resolved file or None) for every header reachable from the source.

        Resolved against the in-memory headers, the source's directory and the include
        paths; what resolves nowhere (CUDA's own headers) is keyed by name and NVRTC version.
        """
        dirs = [Path(d) for d in ((self.source_dir,) if self.source_dir else ()) + self.include_paths]
        in_memory = dict(self.headers)
        seen: dict[str, Path | None] = {}
        todo = [(self.source, Path(self.source_dir) if self.source_dir else None)]
        while todo:
            text, here = todo.pop()
            for quote, inc in (re.findall(_INCLUDE_RE, text) if "include" in text else ()):
                inc = inc.strip()
                if inc in in_memory:
                    key = "mem:" + inc
                    if key not in seen:
                        seen[key] = None
                        todo.append((in_memory[inc], None))
                    continue
                cands = ([here] if (quote == '"' and here is not None) else []) + dirs
                found = next((c / inc for c in cands if (c / inc).is_file()), None)
                key = os.path.realpath(found) if found else "unresolved:" + inc
                if key in seen:
                    continue
                seen[key] = found
                if found is not None:
                    try:
                        todo.append((found.read_text(errors="replace"), found.parent))
                    except OSError:
                        pass
        return sorted(((k, v) for k, v in seen.items()), key=lambda kv: kv[0])

    def key(self, nvrtc: NvrtcIdentity) -> str:
        """The cache key: this request compiled by ``nvrtc`` (its version and its file's content)."""
        kb = KeyBuilder("opsmith.nvrtc").str("opsmith", __version__)
        kb.str("source", self.source).str("arch", self.arch).str("output", self.output)
        kb.strs("options", self.nvrtc_options()).strs("names", self.name_expressions)
        kb.mapping("headers", dict(self.headers))
        for label, path in self.header_files():
            kb.str("header", label)
            if path is not None:
                try:
                    kb.bytes("header.bytes", path.read_bytes())
                except OSError:
                    kb.str("header.bytes", None)
        # what NVRTC is, never where it lies or when it was installed: keys travel
        kb.str("nvrtc.version", nvrtc.version).str("nvrtc.content", nvrtc.content)
        return kb.hexdigest()


    def portable_key(self) -> str:
        """What decides the code apart from the target and NVRTC: the source, the options, the
        names and the bytes of every reachable header (not where they lie). Installed packages
        (:mod:`opsmith._build._prebuilt`) key their binaries by it, so a request made on
        another machine, from the package's own files, finds them."""
        import hashlib
        kb = KeyBuilder("opsmith.portable").str("source", self.source).str("std", self.std)
        kb.strs("defines", [f"{n}={v}" for n, v in self.defines]).strs("options", self.options)
        kb.strs("names", self.name_expressions).mapping("headers", dict(self.headers))
        digests = []
        for label, path in self.header_files():
            try:
                digests.append(hashlib.sha256(path.read_bytes()).hexdigest() if path else label)
            except OSError:
                digests.append("unreadable")
        return kb.strs("header.bytes", sorted(digests)).hexdigest()


_MACRO = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def make_request(source: str | os.PathLike, *, arch: str, output: str = "cubin",
                 std: str | None = "c++17", options: Iterable[str] = (),
                 include_paths: Iterable[str | os.PathLike] = (),
                 defines: Mapping[str, Any] | Iterable[str] | None = None,
                 headers: Mapping[str, str] | None = None,
                 name_expressions: Iterable[str] = (), name: str | None = None) -> CompileRequest:
    """A :class:`CompileRequest` from user arguments (a path or a source string)."""
    if output not in ("cubin", "ptx"):
        raise SpecError(f"output must be 'cubin' or 'ptx', got {output!r}")
    source_dir = None
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                          and source.endswith((".cu", ".cuh")) and len(source) < 4096):
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SpecError(f"cannot read the CUDA source file {path}: {exc.strerror}") from None
        source_dir = str(path.resolve().parent)
        name = name or str(path)
    elif isinstance(source, str):
        text = source
        name = name or "kernel.cu"
    else:
        raise SpecError(f"source must be CUDA C++ text or a path to a .cu file, got {type(source).__name__}")
    if isinstance(options, str):
        raise SpecError("options must be a list of strings, e.g. ['-lineinfo'], not one string")
    defs: list[tuple[str, str | None]] = []
    if isinstance(defines, Mapping):
        defs = [(str(k), None if v is None else str(v)) for k, v in defines.items()]
    elif isinstance(defines, str):
        raise SpecError(f"defines must be a dict or a list, e.g. {{'N': 4}} or ['N=4'], not one string ({defines!r})")
    elif defines is not None:
        for d in defines:
            if isinstance(d, (tuple, list)) and len(d) == 2:  # (name, value), as CompileRequest holds them
                defs.append((str(d[0]), None if d[1] is None else str(d[1])))
            elif isinstance(d, str):
                k, _, v = d.partition("=")
                defs.append((k, v if _ else None))
            else:
                raise SpecError(f"defines: {d!r} is neither 'NAME' / 'NAME=VALUE' nor a (name, value) pair")
    for k, _v in defs:
        if not _MACRO.fullmatch(k):
            raise SpecError(f"defines: {k!r} is not a macro name (a C identifier: letters, digits and _, not "
                            f"starting with a digit); pass {{'NAME': value}} or 'NAME=VALUE'")
    return CompileRequest(
        source=text, name=name, arch=normalize_arch(arch), output=output, std=std,
        options=tuple(str(o) for o in options),
        include_paths=tuple(os.path.abspath(os.fspath(p)) for p in include_paths),
        defines=tuple(sorted(defs)), headers=tuple(sorted((headers or {}).items())),
        name_expressions=tuple(dict.fromkeys(name_expressions)), source_dir=source_dir)
