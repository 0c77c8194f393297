"""Keys that travel: compiled output that does not depend on where the sources lie.

The compilers write source paths into what they produce (``__FILE__``, debug info, coverage
notes). With ``-ffile-prefix-map=ROOT=/opsmith/src`` (gcc 8+, clang 10+; nvcc passes it to
its host compiler with ``-Xcompiler``) every path under the sources' root comes out as
``/opsmith/src/...``, so the same sources checked out at another path compile to the same
bytes, and their keys can name paths relative to the root: the source's own name, the
``-I`` directories under the root and the headers under it. This is ccache's ``base_dir``.

Where the compiler cannot map the paths, the absolute paths stay in the key (the output
really depends on them): an older gcc or clang, another compiler family, a user-given nvcc
host compiler (``-ccbin``), and nvcc's device line info (``-lineinfo``, ``-G``), which
``cicc`` writes from its own, unmapped, file names. Diagnostics are not mapped: compilers
name the real files in their messages.
"""
from __future__ import annotations

import os

from opsmith._record import Record

__all__ = ["CANONICAL_SRC", "CANONICAL_BUILD", "Roots", "source_roots", "cxx_maps_paths",
           "nvcc_maps_paths", "command_flags", "map_flags"]

CANONICAL_SRC = "/opsmith/src"
CANONICAL_BUILD = "/opsmith/build"

# Options whose argument is a path the preprocessor reads (attached or as the next word).
_PATH_OPTS = ("-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-I")
# nvcc options that make cicc write the device code's file names (not mapped by the host compiler).
_DEVICE_LINES = ("-G", "--device-debug", "-lineinfo", "--generate-line-info")


class Roots(Record):
    """The sources' root as the compiler sees it (``given``, absolute) and as stored (``real``)."""

    __slots__ = ("given", "real")

    def canonical(self, path: str) -> str:
        """``path`` as keys name it: under the root -> ``/opsmith/src/rel``; else unchanged."""
        for root in (self.given, self.real):
            if path == root:
                return CANONICAL_SRC
            if path.startswith(root + "/"):
                return CANONICAL_SRC + path[len(root):]
        return path


def source_roots(spec) -> Roots | None:
    """The root of ``spec``'s file sources: the git checkout holding them, else their common
    directory. None for inline sources only, or for a root no prefix map can name.

    A checkout's top (the nearest directory with ``.git``, a worktree's ``.git`` file
    included) makes its ``include/`` beside ``csrc/`` travel with it. Without one (an
    unpacked sdist), the root is the common directory of the sources and the include paths,
    unless that is ``/``: then the sources' own, and include paths elsewhere key by path.
    """
    dirs = [os.path.dirname(s.path) for s in spec.sources if s.path]
    if not dirs:
        return None
    root = common = os.path.commonpath(dirs)
    while True:
        if os.path.exists(os.path.join(root, ".git")):
            break
        parent = os.path.dirname(root)
        if parent == root:  # no checkout: the include paths widen the root, short of "/"
            wide = os.path.commonpath([common, *spec.extra_include_paths])
            root = wide if wide != "/" else common
            break
        root = parent
    if root == "/" or "=" in root or "," in root:
        return None  # nothing to map, or a path no prefix map can spell (nvcc splits at ',')
    return Roots(given=root, real=os.path.realpath(root))


def _supports(family: str | None, version: str | None) -> bool:
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        return False
    return (family == "gcc" and major >= 8) or (family == "clang" and major >= 10)


def cxx_maps_paths(compiler) -> bool:
    """Can this C++ compiler map paths (gcc 8+, clang 10+)?"""
    return _supports(compiler.family, compiler.version)


def nvcc_maps_paths(nvcc, flags: list[str]) -> bool:
    """Can this nvcc unit's output be made path-free? Its host compiler maps the host side;
    nothing maps the device line info (``-lineinfo``, ``-G``), and a host compiler the user
    chose (``-ccbin`` in their flags: ``flags_for`` then adds none) is of unknown family."""
    if flags[:1] != ["-ccbin"] or any(f in _DEVICE_LINES for f in flags):
        return False
    return _supports(getattr(nvcc, "host_family", None), getattr(nvcc, "host_version", None))


def command_flags(rule: str, roots: Roots | None, build_dir: str) -> list[str]:
    """The prefix maps to put on a mapped unit's command line (never in its key).

    The build directory holds inline sources and is the compiler's working directory
    (``DW_AT_comp_dir``): mapped too, so that debug info names no temporary directory.
    """
    pairs = []
    if roots is not None:
        pairs.append((roots.given, CANONICAL_SRC))
        if roots.real != roots.given:
            pairs.append((roots.real, CANONICAL_SRC))
    pairs.append((build_dir, CANONICAL_BUILD))
    out = []
    for old, new in pairs:
        if rule == "nvcc":
            out.append("-Xcompiler")
        out.append(f"-ffile-prefix-map={old}={new}")
    return out


def map_flags(flags: list[str], roots: Roots) -> list[str]:
    """``flags`` with every preprocessor path under the root named canonically (for keys)."""
    out: list[str] = []
    expect = False
    for f in flags:
        if expect:
            out.append(roots.canonical(os.path.abspath(f)))
            expect = False
            continue
        if f in _PATH_OPTS:
            out.append(f)
            expect = True
            continue
        for opt in _PATH_OPTS:
            if f.startswith(opt) and len(f) > len(opt):
                out.append(opt + roots.canonical(os.path.abspath(f[len(opt):])))
                break
        else:
            out.append(f)
    return out
