"""Planning a build: the tools it needs, its translation units and their pre-keys, the link key.

A unit's pre-key covers its source bytes, language, compiler fingerprint, flags, profile and
whether it uses the precompiled header; the dependency index turns it into the unit's key
once the headers it read are known. The link key covers the unit keys, the link flags and
the linking driver (the C++ one unless every unit is C compiled as C).
"""
from __future__ import annotations

import os
from pathlib import Path

from opsmith._build import _prefix
from opsmith._build._profile import profile_for
from opsmith._cache import _deps
from opsmith._cache._keys import KeyBuilder
from opsmith._cache._open import Cache
from opsmith._cache._store import Entry
from opsmith._cache._tiered import shared_state
from opsmith._config import settings
from opsmith._errors import ToolchainError
from opsmith._spec import ExtensionSpec, Source
from opsmith._toolchain._cxx import (Compiler, TorchInfo, _which, find_cxx, python_include_dir, search_dirs,
                                     torch_info)
from opsmith._version import __version__

__all__ = ["Unit", "Toolchain", "plan", "link_key", "artifact_filename", "resolve", "dep_root", "inputs"]


class Unit:
    """One translation unit of a build; ``key`` and ``object_entry`` are filled in as found."""

    __slots__ = ("source", "compiler", "flags", "prekey", "uses_pch", "rule", "key", "object_entry",
                 "deps", "roots", "mapped")

    def __init__(self, source: Source, compiler: str, flags: list[str], prekey: str,
                 uses_pch: bool, rule: str) -> None:
        self.source = source
        self.compiler = compiler
        self.flags = flags            # without the source, -c, -o and depfile options
        self.prekey = prekey
        self.uses_pch = uses_pch
        self.rule = rule              # "cxx", "cc" (C compiled as C) or "nvcc"
        self.key: str | None = None
        self.object_entry: Entry | None = None
        self.deps: list[str] = []     # the user headers the key covers
        self.roots = None             # the sources' root (_prefix.Roots) when paths are mapped
        self.mapped = False           # True: compiled with prefix maps, keyed relative to roots


class Toolchain:
    """Everything about the machine's tools that a build of ``spec`` needs (resolved lazily)."""

    def __init__(self, cache: Cache, spec: ExtensionSpec) -> None:
        self.cxx: Compiler = find_cxx(cache.state)
        self._torch: TorchInfo | None = None
        self.python_include = python_include_dir()
        self.spec = spec
        self.cache = cache
        self.state = cache.state  # machine-local probes (nvcc's, torch's C++ standard)
        self._nvcc = None
        self._cc: Compiler | None = None

    @property
    def torch(self) -> TorchInfo:
        """torch's headers, libraries and identity (imported only by profiles that use torch)."""
        if self._torch is None:
            self._torch = torch_info(self.state)
        return self._torch

    @property
    def nvcc(self):
        if self._nvcc is None:
            from opsmith._toolchain._nvcc import find_nvcc
            self._nvcc = find_nvcc(self.cxx, self.state)
        return self._nvcc

    @property
    def cc(self) -> Compiler:
        """The C compiler (looked for only by a build with C units compiled as C)."""
        if self._cc is None:
            from opsmith._toolchain._cc import find_cc
            self._cc = find_cc(self.cxx, self.state)
        return self._cc

    def archiver(self) -> str:
        """``ar``, for an ``archive`` (looked for only by a build of one)."""
        path = _which("ar", self.state)
        if path is None:
            raise ToolchainError("no archiver 'ar' on PATH to build a static library: install binutils "
                                 "(apt-get install binutils), which the compiler needs anyway")
        return path

    def linker(self, units) -> Compiler:
        """The driver that links ``units``: the C++ one when any unit is C++ or CUDA (its
        runtime needs libstdc++), the C one for C alone (no libstdc++ dependency)."""
        return self.cc if all(u.rule == "cc" for u in units) else self.cxx

    def system_dirs(self, cache_root: Path) -> list[str]:
        dirs = [self.python_include, *search_dirs(self.cxx, self.state), os.fspath(cache_root)]
        if self._cc is not None:
            dirs.extend(search_dirs(self._cc, self.state, lang="c"))
        if self._torch is not None:
            dirs += [*self._torch.include_dirs, self._torch.root]
        if self.spec.with_cuda and self._nvcc is not None:
            dirs.extend(self._nvcc.include_dirs)
        return [os.path.realpath(d) for d in dirs]


def plan(spec: ExtensionSpec, tc: Toolchain) -> list[Unit]:
    prof = profile_for(spec)
    cxx_flags = prof.cxx_flags(spec, tc)
    use_pch = settings.pch and tc.cxx.family in ("gcc", "clang")
    key_parts = prof.key_parts(spec, tc)
    roots = _prefix.source_roots(spec)
    units = []
    for src in spec.sources:
        if src.lang == "cuda":
            compiler, flags, rule, pch = tc.nvcc.path, prof.cuda_flags(spec, tc), "nvcc", False
            fingerprint = tc.nvcc.fingerprint
        elif src.lang == "c" and not prof.c_as_cxx:
            compiler, flags, rule, pch = tc.cc.path, prof.c_flags(spec, tc), "cc", False
            fingerprint = tc.cc.fingerprint
        else:
            compiler, flags, rule = tc.cxx.path, cxx_flags, "cxx"
            if src.lang == "c":
                flags = [*cxx_flags, "-x", "c++"]  # the profile compiles C as C++ (torch does)
            pch = use_pch and prof.uses_pch(src)
            fingerprint = tc.cxx.fingerprint
        # Keys that travel: where the compiler maps the sources' root to a canonical path, the
        # key names the source and the include paths under the root relative to it.
        mapped = (_prefix.nvcc_maps_paths(tc.nvcc, flags) if rule == "nvcc"
                  else _prefix.cxx_maps_paths(tc.cc if rule == "cc" else tc.cxx))
        origin, key_flags = src.path or src.filename, flags
        if mapped and roots is not None:
            origin = roots.canonical(origin) if src.path else origin
            key_flags = _prefix.map_flags(flags, roots)
        prekey = (KeyBuilder("unit-prekey").str("opsmith", __version__).str("lang", src.lang)
                  .str("origin", origin).bytes("text", src.text)
                  .str("compiler", fingerprint).strs("flags", key_flags).str("profile", prof.name)
                  .strs("profile-parts", key_parts).str("pch", "1" if pch else "0")
                  .str("paths", _prefix.CANONICAL_SRC if mapped else "absolute").hexdigest())
        unit = Unit(src, compiler, flags, prekey, pch, rule)
        unit.roots, unit.mapped = (roots if mapped else None), bool(mapped)
        units.append(unit)
    return units


def link_key(spec: ExtensionSpec, tc: Toolchain, units: list[Unit], ldflags: list[str]) -> str:
    prof = profile_for(spec)
    kb = (KeyBuilder("link").str("opsmith", __version__).str("kind", spec.kind)
          .strs("units", [u.key or "" for u in units]).strs("ldflags", ldflags)
          .str("compiler", tc.linker(units).fingerprint).str("profile", prof.name)
          .strs("profile-parts", prof.key_parts(spec, tc))
          .str("link-stubs", "1" if prof.link_stubs(spec, ldflags) else "0"))
    return kb.hexdigest()


def artifact_filename(spec: ExtensionSpec) -> str:
    if spec.kind == "archive":
        return f"{spec.name}.a"
    return spec.name if spec.kind == "executable" else f"{spec.name}.so"


def resolve(cache: Cache, units: list[Unit]) -> None:
    index = _deps.DepIndex(shared_state(cache))  # a cluster's shared cache shares the index
    for u in units:
        if u.key is None:
            found = index.resolve_with_deps(u.prekey, dep_root(u))
            if found is not None:
                u.key, u.deps = found


def dep_root(u: Unit) -> tuple[str, str] | None:
    """How the dependency index names the headers under ``u``'s sources' root, if it does."""
    return (u.roots.real, _prefix.CANONICAL_SRC) if u.roots is not None else None


def inputs(spec: ExtensionSpec, tc: Toolchain, units: list[Unit]) -> tuple[str, ...]:
    """The files an artifact of ``spec`` rests on, for the warm index's stat check."""
    files = [u.source.path for u in units if u.source.path]
    for u in units:
        files.extend(u.deps)
    files.append(os.path.realpath(tc.cxx.path))
    if any(u.rule == "cc" for u in units):
        files.append(os.path.realpath(tc.cc.path))
    if spec.with_cuda:
        files.append(os.path.realpath(tc.nvcc.path))
    files.extend(profile_for(spec).inputs(spec, tc))
    return tuple(dict.fromkeys(files))
