"""Triton's compiled C stubs through opsmith's store.

Before it launches its first kernel in a process whose Triton cache is empty, Triton compiles
small C extensions with the host compiler: its driver utilities (``cuda_utils``) and kernel
launchers (``__triton_launcher``), about 0.3 s each on an H100 host. A node that takes every
graph and kernel from the shared tier still paid that (measured: 0.6 s of the 3.2 s to its
first step, the rest of the gap to inductor's local warm cache). Here Triton's builder
(``triton.runtime.build._build``, private: the one Triton name opsmith touches) is wrapped:
a stub whose binary is in opsmith's store is written where the builder would have written it
and not compiled; one that is not is compiled by Triton as before and its binary published.

The key is everything the binary depends on: the stub's name and the sha256 of its source,
the include and library directories and libraries the builder was given (with any further
arguments), the compiler Triton picks (``CC``, else gcc, else clang) by its ``-v`` output,
Triton's version, the Python (version, ABI suffix, include directory) and the platform.
A binary from the shared tier is signed and verified like every opsmith entry; Python then
loads it, as it would load one Triton built.

Installed at the first lookup of one of inductor's caches made once Triton is imported
(opsmith never imports Triton itself).
"""
from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
import sys
import sysconfig
import threading

from opsmith._cache._keys import KeyBuilder, file_sha256

__all__ = ["StubCache", "install", "problems", "stub_key", "uninstall"]

log = logging.getLogger("opsmith.compile_cache")

ARTIFACT = "triton-stub"
_PARAMS = ("name", "src", "srcdir", "library_dirs", "include_dirs", "libraries")
_saved: dict[str, object] = {}   # module name -> the _build it had
_mutex = threading.Lock()


def _triton_build_module():
    try:
        import triton.runtime.build as rb
    except Exception:  # noqa: BLE001 - no Triton, or one that fails to import: nothing to hook
        return None
    return rb


def problems() -> list[str]:
    """What this Triton lacks for the hook (empty when it has it, or when there is no Triton)."""
    rb = _triton_build_module()
    if rb is None:
        return []
    fn = getattr(rb, "_build", None)
    if fn is None:
        return ["triton.runtime.build._build"]
    import inspect
    try:
        names = list(inspect.signature(fn).parameters)[:len(_PARAMS)]
    except (TypeError, ValueError):
        names = []
    if tuple(names) != _PARAMS:
        return [f"triton.runtime.build._build({', '.join(_PARAMS)}, ...) (this Triton has ({', '.join(names)}))"]
    return []


@functools.cache
def _compiler() -> str:
    """The C compiler Triton's builder runs: ``CC``, else gcc, else clang."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or "cc"


def _triton_version() -> str:
    try:
        import triton
        return str(getattr(triton, "__version__", "unknown"))
    except Exception:  # noqa: BLE001
        return "unknown"


def stub_key(name: str, src: str, library_dirs, include_dirs, libraries, rest: tuple, kwargs: dict) -> str:
    """opsmith's key for the binary Triton's builder makes of ``src`` with these arguments."""
    from opsmith.compile_cache._kernels import _compiler_identity
    cc = os.environ.get("CC")
    kb = KeyBuilder("triton-stub-v1").str("name", name).str("source", file_sha256(src)) \
        .strs("library_dirs", [str(d) for d in library_dirs]) \
        .strs("include_dirs", [str(d) for d in include_dirs]) \
        .strs("libraries", [str(x) for x in libraries]) \
        .str("arguments", repr((rest, sorted(kwargs.items())))) \
        .str("compiler", _compiler_identity(_compiler())).str("CC", cc or "") \
        .str("triton", _triton_version()) \
        .str("python", sys.version).str("ext_suffix", str(sysconfig.get_config_var("EXT_SUFFIX"))) \
        .str("python_include", str(sysconfig.get_paths().get("include"))) \
        .str("platform", f"{platform.system()} {platform.machine()}")
    return kb.hexdigest()


class StubCache:
    """The wrapper of Triton's builder for one :class:`~._backend.CompileCache`."""

    def __init__(self, owner) -> None:
        self.owner = owner

    def build(self, original, name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs):
        counters = self.owner.counters
        try:
            key = stub_key(name, src, library_dirs, include_dirs, libraries, rest, kwargs)
        except OSError:
            return original(name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs)
        target = os.path.join(srcdir, f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}")
        entry = self.owner.cache.store.get(key)
        if entry is not None:
            from opsmith.compile_cache._kernels import _install
            _install(entry.file("binary"), target)
            counters.add(ARTIFACT, "hits")
            return target
        counters.add(ARTIFACT, "misses")
        # not refused under OPSMITH_MUST_HIT: a stub is Triton's, per machine and ~0.3 s, and a
        # node whose bundle came from a machine with a warm Triton cache has none of them
        out = original(name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs)
        counters.add(ARTIFACT, "compiles")
        if out and os.path.isfile(out):
            self.owner.cache.store.put(key, {"binary": out}, kind="torch-compile", name=f"triton-stub {name}",
                                       meta={"artifact": ARTIFACT, "triton": _triton_version()})
            counters.add(ARTIFACT, "puts")
        return out


def install(owner) -> bool:
    """Wrap Triton's builder (here and in every Triton module that imported it by name).
    False when there is no Triton or it lacks the hook (logged once)."""
    with _mutex:
        if _saved:
            return True
        rb = _triton_build_module()
        if rb is None:
            return False
        missing = problems()
        if missing:
            log.warning("opsmith's compile cache does not cache Triton's C stubs with this Triton (it lacks %s); "
                        "they compile on each machine", "; ".join(missing))
            return False
        original = rb._build
        stubs = StubCache(owner)

        @functools.wraps(original)
        def _build(name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs):
            if not _saved:  # uninstalled; a module imported it by name while it was installed
                return original(name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs)
            return stubs.build(original, name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs)

        for mod_name, mod in list(sys.modules.items()):
            if mod is not None and mod_name.startswith("triton") and getattr(mod, "_build", None) is original:
                _saved[mod_name] = original
                mod._build = _build
        return True


def uninstall() -> None:
    """Put Triton's builder back."""
    with _mutex:
        for mod_name, original in _saved.items():
            mod = sys.modules.get(mod_name)
            if mod is not None:
                mod._build = original
        _saved.clear()
