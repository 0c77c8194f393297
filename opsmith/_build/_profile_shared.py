"""The ``shared-library`` profile: a C/C++/CUDA shared library (or executable, or archive) with no torch.

No torch header, define or library; no Python. ``.c`` sources are compiled as C by the C
compiler (``CC``, else the C++ compiler's C sibling: see ``_toolchain/_cc.py``), so their
functions keep their C names; C++ sources by the C++ compiler. CUDA sources are compiled by
nvcc for the archs of ``TORCH_CUDA_ARCH_LIST`` (or the visible GPUs) and linked against the
CUDA runtime. A ``-std=`` in ``extra_cflags`` goes to the language it names only.
Used by :func:`build_shared_library` and by targets that are not torch extensions (an ONNX
Runtime op library, exported C launchers).
"""
from __future__ import annotations

from opsmith._build._profile import Profile
from opsmith._config import settings
from opsmith._toolchain._nvcc import has_ccbin

__all__ = ["SharedLibrary", "build_shared_library", "build_static_library", "C_STD"]

# C units' standard unless extra_cflags name one: the default of gcc 8-14 and clang 11+, pinned
# so that gcc 15 (gnu23: `bool` a keyword, `f()` a prototype) compiles the same code; GNU, not
# strict c17, so that POSIX declarations stay visible as they are in C++ (g++ defines _GNU_SOURCE).
C_STD = "-std=gnu17"


def _is_std(flag: str, cxx: bool) -> bool:
    """Is ``flag`` a ``-std=`` of C++ (``cxx``) or of C?"""
    return flag.startswith(("-std=", "--std=")) and ("++" in flag) == cxx


class SharedLibrary(Profile):
    name = "shared-library"

    def key_parts(self, spec, tc) -> list[str]:
        return ["shared-library/1"]

    def cxx_flags(self, spec, tc) -> list[str]:
        return self._host_flags(spec, tc, [f for f in spec.extra_cflags if not _is_std(f, cxx=False)])

    def c_flags(self, spec, tc) -> list[str]:
        user = [f for f in spec.extra_cflags if not _is_std(f, cxx=True)]
        std = [] if any(_is_std(f, cxx=False) for f in user) else [C_STD]
        return self._host_flags(spec, tc, std + user)

    def _host_flags(self, spec, tc, user: list[str]) -> list[str]:
        flags = [f"-I{p}" for p in spec.extra_include_paths]
        if spec.with_cuda:
            for inc in tc.nvcc.include_dirs:
                flags += ["-isystem", inc]
        flags += ["-fPIC"]
        if not any(f.startswith("-O") for f in user) and settings.opt_level:
            flags.append(settings.opt_level)
        return flags + user

    def cuda_flags(self, spec, tc) -> list[str]:
        from opsmith._toolchain import _archs
        user = list(spec.extra_cuda_cflags)
        tc.nvcc.check_host(user)
        flags = [] if has_ccbin(user) else ["-ccbin", tc.nvcc.host]
        flags += [f"-I{p}" for p in spec.extra_include_paths]
        flags += ["-Xcompiler", "-fPIC"]
        if not any("arch" in f for f in user):
            archs = _archs.resolve_archs(settings.cuda_arch_list, nvcc_archs=tc.nvcc.archs,
                                         cuda_versions=(tc.nvcc.version,), state=tc.state)
            flags += _archs.gencode_flags(archs)
        return flags + user

    def ldflags(self, spec, tc) -> list[str]:
        if spec.kind == "archive":
            return []  # ar puts the objects together: nothing is linked
        flags = [] if spec.kind == "executable" else ["-shared"]
        flags += list(spec.extra_ldflags)
        if spec.with_cuda:
            flags += tc.nvcc.link_flags()
        if spec.kind != "executable" and any(s.lang != "c" for s in spec.sources):
            # C++ in a shared object: the process's C++ runtime, never a second copy of it
            from opsmith._toolchain import _libstdcxx
            runtime = _libstdcxx.shared_runtime(tc.cxx, tc.state)
            flags += [runtime] if runtime else []
        return flags


def build_shared_library(name: str, sources, *, extra_cflags=None, extra_cuda_cflags=None,
                         extra_ldflags=None, extra_include_paths=None, build_directory=None,
                         with_cuda=None, verbose=False):
    """Build a plain shared library (no torch, no Python) from C/C++/CUDA files; cached.

    Returns the :class:`~opsmith.Artifact`; load it with ``ctypes.CDLL(artifact.path)``.

    Examples
    --------
    >>> import ctypes, opsmith                                              # doctest: +SKIP
    >>> art = opsmith.build_shared_library("answer", ["answer.c"])         # doctest: +SKIP
    >>> ctypes.CDLL(art.path).answer()                                      # doctest: +SKIP
    42
    """
    from opsmith._build._engine import build_spec
    from opsmith._spec import ExtensionSpec
    spec = ExtensionSpec.from_files(
        name, sources, kind="library", with_cuda=with_cuda, profile="shared-library",
        extra_cflags=extra_cflags, extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths, build_directory=build_directory, verbose=verbose)
    return build_spec(spec)


def build_static_library(name: str, sources, *, extra_cflags=None, extra_include_paths=None,
                         build_directory=None, verbose=False):
    """Build a static library ``<name>.a`` (no torch, no Python) from C/C++ files; cached.

    The units are compiled as for :func:`build_shared_library` (same flags: a unit both
    libraries share is compiled once) and put together by ``ar``; nothing is linked, so the
    program that links the archive names the libraries it needs. Returns the
    :class:`~opsmith.Artifact` (``kind="archive"``).

    Examples
    --------
    >>> art = build_static_library("answer", ["answer.c"])   # doctest: +SKIP
    >>> art.path.name                                         # doctest: +SKIP
    'answer.a'
    """
    from opsmith._build._engine import build_spec
    from opsmith._spec import ExtensionSpec
    spec = ExtensionSpec.from_files(
        name, sources, kind="archive", with_cuda=False, profile="shared-library", extra_cflags=extra_cflags,
        extra_include_paths=extra_include_paths, build_directory=build_directory, verbose=verbose)
    return build_spec(spec)
