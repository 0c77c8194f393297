"""Finding the tools a build needs, and fingerprinting them for cache keys.

Nothing here runs at import. Each probe runs once per process; the expensive ones (running
the compiler) are remembered on disk in the machine-local state, keyed by the compiler binary's
path, size, mtime and inode, so that a warm load in a fresh process runs no subprocess.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from opsmith._config import on_reset as _on_reset
from opsmith._cache._stamps import stamp_of
from opsmith._cache._state import memo
from opsmith._record import Record
from opsmith._config import settings
from opsmith._errors import ToolchainError
from opsmith._cache._keys import KeyBuilder
from opsmith._version import __version__

__all__ = ["Compiler", "TorchInfo", "find_cxx", "torch_info", "find_ninja", "max_jobs",
           "python_include_dir", "probe_compiler", "search_dirs"]

_RECORD_NS = "toolchain"
_PROBE_FORMAT = 4  # 4: system_dirs is None (probed by search_dirs when a build needs it)


class Compiler(Record):
    """A C or C++ compiler: where it is, what it is, and a fingerprint of its identity."""

    __slots__ = ('path', 'family', 'version', 'target', 'fingerprint', 'system_dirs')


    @property
    def major(self) -> int:
        try:
            return int(self.version.split(".")[0])
        except ValueError:
            return 0


class TorchInfo(Record):
    """What an extension build needs to know of the installed torch."""

    __slots__ = ('version', 'root', 'include_dirs', 'lib_dir', 'cxx11_abi', 'std', 'cuda', 'fingerprint',
                 'cuda_std')
    _defaults = {'cuda_std': 'c++17'}



def _compiler_candidates() -> list[str]:
    explicit = settings.cxx
    if explicit:
        return [explicit]
    return ["clang++", "c++", "g++"]


_WHICH: dict[tuple[str, str], str] = {}


def _which(cmd: str, state=None) -> str | None:
    """``shutil.which``, remembered in the machine-local state while no directory on PATH has changed.

    Scanning PATH costs ~0.1 ms; a warm load re-checks the directories' mtimes instead
    (installing a compiler into one of them changes its mtime).
    """
    # Run the compiler by the name found on PATH, not its realpath: clang++ is a link to
    # clang, and only the clang++ name makes the driver link C++ (libstdc++).
    pathvar = os.environ.get("PATH", "")
    known = _WHICH.get((cmd, pathvar))
    if known is not None:
        return known or None
    def look() -> dict:
        found = shutil.which(cmd)
        dirs = []
        for d in pathvar.split(os.pathsep):
            try:
                dirs.append([d, os.stat(d or ".").st_mtime_ns])
            except OSError:
                dirs.append([d, None])
        return {"path": os.path.abspath(found) if found else "", "dirs": dirs}

    rec_id = "which-" + KeyBuilder("which").str("cmd", cmd).str("PATH", pathvar).hexdigest()
    doc = memo(state if "/" not in cmd else None, _RECORD_NS, rec_id, look,
               valid=lambda d: isinstance(d["path"], str) and _dirs_unchanged(d["dirs"]))
    result = doc["path"] or ""
    _WHICH[(cmd, pathvar)] = result
    return result or None


def _dirs_unchanged(dirs) -> bool:
    if not isinstance(dirs, list):
        return False
    for d, mtime in dirs:
        try:
            if os.stat(d or ".").st_mtime_ns != mtime:
                return False
        except OSError:
            if mtime is not None:
                return False
    return True


def find_cxx(state=None) -> Compiler:
    """The C++ compiler to use: ``OPSMITH_CXX``/``CXX`` if set, else clang++, c++, g++."""
    candidates = _compiler_candidates()
    for cand in candidates:
        path = _which(cand, state)
        if path:
            return probe_compiler(path, state)
    if settings.cxx:
        raise ToolchainError(
            f"the C++ compiler {settings.cxx!r} named by CXX/OPSMITH_CXX was not found on PATH. "
            f"Install it or point CXX at an installed compiler (e.g. CXX=g++).")
    raise ToolchainError(
        "no C++ compiler found (looked for clang++, c++ and g++ on PATH). Install one: "
        "`apt-get install g++` (Debian/Ubuntu), `dnf install gcc-c++` (Fedora), or "
        "`conda install -c conda-forge cxx-compiler`; clang++ (`apt-get install clang`) builds "
        "torch extensions fastest.")


def probe_compiler(path: str, state=None) -> Compiler:
    """Identify the compiler at ``path`` (memoized in-process and on disk)."""
    try:
        st = os.stat(path)
    except OSError:
        raise ToolchainError(f"the compiler {path} cannot be read. Reinstall it or set CXX.") from None
    ident = KeyBuilder("compiler-probe").str("path", path).str("real", os.path.realpath(path)).str(
        "stat", repr(stamp_of(st))).str("fmt", str(_PROBE_FORMAT)).hexdigest()
    return _probe_cached(path, ident, state)


@functools.lru_cache(maxsize=None)
def _probe_cached(path: str, ident: str, state) -> Compiler:
    doc = memo(state, _RECORD_NS, "cxx-" + ident, lambda: _run_probe(path)._asdict(),
               valid=lambda d: _compiler_of(d) is not None)
    return _compiler_of(doc)


def _compiler_of(doc: dict) -> Compiler:
    """A probe's document as a :class:`Compiler` (TypeError/KeyError when it is not one)."""
    dirs = doc["system_dirs"]
    return Compiler(**{**doc, "system_dirs": None if dirs is None else tuple(dirs)})


def _run_probe(path: str) -> Compiler:
    """Run ``--version`` and ``-dumpmachine`` (at once: the two make the fingerprint).

    The include search list (``-E -v``, another compiler run) is left for
    :func:`search_dirs`: only a build needs it, and a process that loads an entry another
    machine built must form the key without paying for it.
    """
    env = dict(os.environ, LC_ALL="C")
    try:
        runs = [subprocess.Popen([path, arg], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
                for arg in ("--version", "-dumpmachine")]
        try:
            (vout, verr), (target, _) = (p.communicate(timeout=60) for p in runs)
        finally:
            for p in runs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"the compiler {path} could not be run ({exc}). Reinstall it or set "
                             f"CXX to a working compiler.") from None
    text = vout + verr
    target = target.strip()
    if runs[0].returncode != 0:
        raise ToolchainError(f"`{path} --version` failed:\n{text.strip()}\nSet CXX to a working compiler.")
    family = "clang" if "clang" in text.lower() else ("gcc" if re.search(r"\b(gcc|g\+\+|GCC)\b", text)
                                                       or "Free Software Foundation" in text else "unknown")
    m = re.search(r"(\d+\.\d+(\.\d+)?)", text.splitlines()[0] if text else "")
    version = m.group(1) if m else "0"
    fp = KeyBuilder("compiler").str("path", path).str("real", os.path.realpath(path)).str("version-text", text).str("target", target).hexdigest()
    return Compiler(path, family, version, target, fp, None)


def search_dirs(comp: Compiler, state=None, lang: str = "c++") -> tuple[str, ...]:
    """The compiler's ``#include <...>`` search list for ``lang`` (``"c++"`` or ``"c"``;
    memoized in-process and on disk)."""
    if comp.system_dirs is not None and lang == "c++":
        return comp.system_dirs
    try:
        st = os.stat(comp.path)
    except OSError:
        raise ToolchainError(f"the compiler {comp.path} cannot be read. Reinstall it or set CXX.") from None
    ident = KeyBuilder("compiler-dirs").str("path", comp.path).str("real", os.path.realpath(comp.path)).str(
        "stat", repr(stamp_of(st))).str("fingerprint", comp.fingerprint).hexdigest()
    if lang != "c++":  # the C++ list keeps its record id (machines' state files stay valid)
        ident = KeyBuilder("compiler-dirs-lang").str("ident", ident).str("lang", lang).hexdigest()
    return _search_dirs_cached(comp.path, ident, state, lang)


@functools.cache
def _search_dirs_cached(path: str, ident: str, state, lang: str = "c++") -> tuple[str, ...]:
    return tuple(memo(state, _RECORD_NS, "cxx-dirs-" + ident, lambda: _probe_search_dirs(path, lang),
                      valid=lambda d: isinstance(d, list) and all(isinstance(x, str) for x in d)))


def _probe_search_dirs(path: str, lang: str = "c++") -> list[str]:
    env = dict(os.environ, LC_ALL="C")
    try:
        search = subprocess.run([path, "-E", "-x", lang, "-", "-v"], input="", capture_output=True,
                                text=True, env=env, timeout=60, check=False).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"the compiler {path} could not be run ({exc}). Reinstall it or set "
                             f"CXX to a working compiler.") from None
    dirs = []
    inside = False
    for line in search.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            break
        elif inside and line.startswith(" "):
            dirs.append(os.path.realpath(line.strip().split(" (")[0]))
    return dirs


_TORCH_INFO: list[TorchInfo] = []


def torch_info(state=None) -> TorchInfo:
    """Versions, include and library directories and ABI of the installed torch (once per process)."""
    if not _TORCH_INFO:
        _TORCH_INFO.append(_torch_info(state))
    return _TORCH_INFO[0]


def _torch_info(state) -> TorchInfo:
    try:
        import torch
    except ImportError:
        raise ToolchainError("torch is not installed: `pip install torch`.") from None
    root = os.path.dirname(os.path.realpath(torch.__file__))
    include = os.path.join(root, "include")
    include_dirs = (include, os.path.join(include, "torch", "csrc", "api", "include"))
    lib_dir = os.path.join(root, "lib")
    if not os.path.isfile(os.path.join(include, "torch", "extension.h")):
        raise ToolchainError(f"torch's C++ headers are missing ({include}/torch/extension.h). "
                             f"Reinstall torch from a wheel that ships them (`pip install --force-reinstall torch`).")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    std, cuda_std = _torch_stds(root, state)
    ext_h = os.stat(os.path.join(include, "torch", "extension.h"))
    fp = KeyBuilder("torch").str("version", torch.__version__).str("root", root).str(
        "abi", str(abi)).str("std", std).str("cuda", torch.version.cuda).str(
        "headers-stat", f"{ext_h.st_mtime_ns}:{ext_h.st_size}").hexdigest()
    return TorchInfo(torch.__version__, root, include_dirs, lib_dir, abi, std, torch.version.cuda, fp, cuda_std)


def _torch_stds(root: str, state=None) -> tuple[str, str]:
    """The C++ standards torch's own extension builder gives C++ sources and nvcc: one reader.

    Read from torch's ``utils/cpp_extension.py`` (never imported) and remembered in the
    machine-local state while that file keeps its stamp: reading it costs a warm load 0.2 ms.
    The nvcc standard matters: with torch 2.11 (c++17), nvcc on a .cu that includes torch
    headers took 46.4 s at c++17 and 52.2 s at c++20 on the H100 machine.
    """
    path = os.path.join(root, "utils", "cpp_extension.py")
    try:
        st = os.stat(path)
    except OSError:
        return "c++17", "c++17"

    def read() -> dict:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            return {"cxx": "c++17", "cuda": "c++17"}
        cxx = torch_std_from_source(text)
        return {"cxx": cxx, "cuda": torch_nvcc_std_from_source(text) or cxx}

    rec_id = "stds-" + KeyBuilder("torch-stds").str("file", path).str("stat", repr(stamp_of(st))).hexdigest()
    ok = ("c++17", "c++20", "c++14", "c++23")
    if state is None:
        doc = read()
    else:
        doc = state.memo(_RECORD_NS, rec_id, read, valid=lambda d: d["cxx"] in ok and d["cuda"] in ok)
    return doc["cxx"], doc["cuda"]


def torch_nvcc_std_from_source(text: str) -> str | None:
    """The ``-std`` torch's builder passes to nvcc (``cuda_flags.append('-std=...')``), if found."""
    import re
    m = re.search(r"cuda_flags\.append\(['\"]-std=(c\+\+\d+)['\"]\)", text)
    return m[1] if m else None


def torch_std_from_source(text: str) -> str:
    """The ``-std`` torch's JIT builder gives C++ sources, from its ``cpp_extension.py`` text.

    The flag list of the ninja build (``cflags = common_cflags + ['-fPIC', '-std=c++NN']``)
    is what counts; docstrings mention other standards (torch 2.11 uses c++17 but shows a
    c++20 example), so a bare search would be wrong.
    """
    import re
    m = re.search(r"cflags\s*=\s*common_cflags\s*\+\s*\[\s*['\"]-fPIC['\"]\s*,\s*['\"]-std=(c\+\+\d+)['\"]", text)
    if m is None:
        m = re.search(r"common_cflags\s*\+=\s*\[\s*['\"]-std=(c\+\+\d+)['\"]", text)
    return m.group(1) if m else "c++17"


@functools.lru_cache(maxsize=1)
def python_include_dir() -> str:
    path = sysconfig.get_config_var("INCLUDEPY")  # 7 us; get_path() costs 0.2 ms
    if not path or not os.path.isfile(os.path.join(path, "Python.h")):
        path = sysconfig.get_path("include", scheme="posix_prefix")
    if not path or not os.path.isfile(os.path.join(path, "Python.h")):
        raise ToolchainError(
            f"Python's C headers (Python.h) are missing from {path}. Install them: "
            f"`apt-get install python{sys.version_info.major}.{sys.version_info.minor}-dev` "
            f"(Debian/Ubuntu) or `dnf install python3-devel`.")
    return path


@functools.lru_cache(maxsize=1)
def python_abi() -> str:
    return f"{sys.implementation.cache_tag}:{sysconfig.get_config_var('EXT_SUFFIX')}:{__version__}"


@functools.lru_cache(maxsize=1)
def find_ninja() -> str:
    """The ninja binary: the `ninja` Python package's, else one on PATH."""
    try:
        import ninja
        path = os.path.join(ninja.BIN_DIR, "ninja")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    path = shutil.which("ninja")
    if path:
        return path
    raise ToolchainError("ninja is not installed; opsmith builds through it. Run `pip install ninja`.")


def _available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def max_jobs(per_job_bytes: int = 3 << 29) -> int:
    """Parallel compile jobs: ``MAX_JOBS``, else the cores capped by available memory.

    A torch translation unit takes 1–2 GiB in the compiler (nvcc more); running one per core
    on a machine with little memory is how parallel extension builds take machines down.
    """
    explicit = settings.max_jobs
    if explicit:
        return explicit
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mem = _available_memory_bytes()
    by_mem = max(1, mem // per_job_bytes) if mem else cores
    return max(1, min(cores, by_mem))


@_on_reset
def _forget() -> None:
    _WHICH.clear()
    _TORCH_INFO.clear()
    _probe_cached.cache_clear()
    _search_dirs_cached.cache_clear()
