"""``opsmith doctor``: one table of everything a build needs, what was found, and the fix.

Each check returns rows (:class:`Check`): ``ok``, ``warning`` (a feature is unavailable or
something looks odd, builds still work) or ``problem`` (builds of some kind will fail). Every
warning and problem carries a one-line fix. Nothing is written anywhere: the cache directory
is probed with a temporary file that is removed again, and compilers are probed without the
store.
"""
from __future__ import annotations

import errno
import logging
import os
import platform
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from opsmith._config import settings
from opsmith._errors import CacheError, ConfigError, OpsmithError, ToolchainError

from opsmith.cli._doctor_base import (_LOW_SPACE, _NO_SPACE, OK, PROBLEM, WARNING, Check, _Context,
                                      _fix_of, _run)
from opsmith.cli._doctor_cuda import (check_arch_list, check_cuda_home,
                                      check_driver_and_gpus, check_nvcc, check_nvrtc)

__all__ = ["OK", "PROBLEM", "WARNING", "Check", "run_checks", "CHECKS"]


# -- the checks -------------------------------------------------------------------------------
def check_python(ctx: _Context) -> list[Check]:
    from opsmith._toolchain._cxx import python_include_dir
    found = f"{platform.python_version()} ({sys.executable})"
    try:
        inc = python_include_dir()
    except ToolchainError as exc:
        return [Check("python", PROBLEM, found + ", C headers (Python.h) missing", _fix_of(exc))]
    return [Check("python", OK, f"{found}, headers in {inc}")]


def check_torch(ctx: _Context) -> list[Check]:
    from opsmith._toolchain._cxx import torch_info
    try:
        info = torch_info()
    except ToolchainError as exc:
        return [Check("torch", PROBLEM, "not usable", _fix_of(exc))]
    ctx.torch_ok = True
    ctx.torch_cuda = info.cuda
    build = f"CUDA {info.cuda} build" if info.cuda else "CPU-only build (CUDA extensions need a CUDA build)"
    return [Check("torch", OK, f"{info.version}, {build}, C++ ABI _GLIBCXX_USE_CXX11_ABI={info.cxx11_abi}, "
                                f"-std={info.std} ({info.root})")]


def check_compilers(ctx: _Context) -> list[Check]:
    from opsmith._toolchain._cxx import find_cxx, probe_compiler
    rows = []
    try:
        cxx = find_cxx()
    except ToolchainError as exc:
        return [Check("C++ compiler", PROBLEM, "none usable", _fix_of(exc))]
    ctx.cxx = cxx
    rows.append(Check("C++ compiler", OK, f"{cxx.family} {cxx.version} ({cxx.path}), used for builds"
                      + (" (from CXX/OPSMITH_CXX)" if settings.cxx else "")))
    others = []
    for cand in ("clang++", "g++", "c++"):
        path = shutil.which(cand)
        if not path or os.path.abspath(path) == cxx.path:
            continue
        try:
            c = probe_compiler(os.path.abspath(path))
            others.append(f"{cand}: {c.family} {c.version}")
        except ToolchainError:
            others.append(f"{cand}: does not run")
    if others:
        rows.append(Check("other compilers", OK, "; ".join(others)))
    rows.append(_cxx_runtime(cxx))
    # An optimisation flag the compiler rejects fails every build: try it on an empty file.
    try:
        opt = settings.opt_level
    except ConfigError:
        return rows
    if opt:
        proc = _run([cxx.path, opt, "-fsyntax-only", "-x", "c++", "-"])
        if proc is not None and proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["rejected"])[0]
            rows.append(Check("OPSMITH_OPT_LEVEL", PROBLEM, f"{opt!r} is rejected by {cxx.path}: {first}",
                              "Set OPSMITH_OPT_LEVEL to a flag the compiler accepts (-O0, -O1, -O2, -O3) "
                              "or unset it."))
    return rows


def _cxx_runtime(cxx) -> Check:
    """Which libstdc++ a C++ module links: the process's shared one, never a second copy."""
    from opsmith._toolchain import _libstdcxx
    try:
        runtime = _libstdcxx.shared_runtime(cxx)
    except ToolchainError as exc:
        return Check("C++ runtime", PROBLEM, "the compiler would put its own libstdc++ in every module", _fix_of(exc))
    if runtime is None:
        return Check("C++ runtime", OK, "the compiler links the shared libstdc++")
    return Check("C++ runtime", WARNING, f"the compiler has only libstdc++.a; opsmith links {runtime} instead "
                 "(a second C++ runtime in the process breaks iostreams)",
                 "Nothing to do for opsmith; torch.utils.cpp_extension builds with this compiler carry their own "
                 "libstdc++: point CXX at a compiler with a shared libstdc++ for those")


def check_ninja(ctx: _Context) -> list[Check]:
    from opsmith._toolchain._cxx import find_ninja
    try:
        path = find_ninja.__wrapped__()  # not the memoized answer: PATH may have changed
    except ToolchainError as exc:
        return [Check("ninja", PROBLEM, "not found (opsmith builds through ninja; torch falls back "
                      "to a slow serial build without it)", _fix_of(exc))]
    proc = _run([path, "--version"])
    version = proc.stdout.strip() if proc is not None and proc.returncode == 0 else "?"
    return [Check("ninja", OK, f"{version} ({path})")]


def _mount_of(path: str) -> tuple[str, str, str] | None:
    """(mount point, filesystem type, mount options) of the mount holding ``path``."""
    best = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if len(fields) < 6 or not rfields:
                    continue
                point = fields[4].replace("\\040", " ")
                if path == point or path.startswith(point.rstrip("/") + "/"):
                    if best is None or len(point) >= len(best[0]):
                        best = (point, rfields[0], fields[5])
    except OSError:
        return None
    return best


def _write_probe(directory: Path) -> OSError | None:
    """Write and remove a small file: catches a full or read-only filesystem for real."""
    try:
        fd, name = tempfile.mkstemp(prefix=".doctor-", dir=directory)
    except OSError as exc:
        return exc
    try:
        os.write(fd, b"\0" * 65536)
        os.fsync(fd)
        return None
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
        os.unlink(name)


def check_cache(ctx: _Context) -> list[Check]:
    from opsmith._cache._root import check_private_dir
    root = settings.cache_path
    rows: list[Check] = []
    env_fix = "or set OPSMITH_CACHE_DIR to a directory of your own on a local disk"
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    vfs = os.statvfs(existing)
    mount = _mount_of(os.path.realpath(existing))
    fs = f"{mount[1]} at {mount[0]}" if mount else "?"
    if existing != root:
        where = f"{root} (not created yet; it will be, mode 700)"
    else:
        st = root.stat()
        try:
            owner = __import__("pwd").getpwuid(st.st_uid).pw_name
        except (KeyError, ImportError):
            owner = str(st.st_uid)
        where = f"{root} (owner {owner}, mode {stat.S_IMODE(st.st_mode):o})"
        try:
            check_private_dir(root, st)
        except CacheError as exc:
            return [Check("cache directory", PROBLEM, where, _fix_of(exc))]
    if vfs.f_flag & getattr(os, "ST_RDONLY", 1):
        return [Check("cache directory", PROBLEM, f"{where} is on a read-only filesystem ({fs})",
                      "Set OPSMITH_CACHE_DIR to a writable directory (e.g. ~/.cache/opsmith).")]
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing != root:
            return [Check("cache directory", PROBLEM, f"{root} does not exist and cannot be created "
                          f"({existing} is not writable by you)",
                          f"Create it (mkdir -p {root} && chmod 700 {root}) {env_fix}.")]
        return [Check("cache directory", PROBLEM, f"{where}: not writable by you",
                      f"Run: chmod u+rwx {root}, {env_fix}.")]
    free = vfs.f_bavail * vfs.f_frsize
    if vfs.f_flag & getattr(os, "ST_NOEXEC", 8):
        rows.append(Check("cache directory", PROBLEM, f"{where} is on a noexec mount ({fs}): built "
                          f"extensions cannot be loaded from it",
                          f"Set OPSMITH_CACHE_DIR to a directory on a mount without noexec "
                          f"(e.g. ~/.cache/opsmith), or remount {mount[0] if mount else 'it'} with exec."))
    else:
        rows.append(Check("cache directory", OK, f"{where}, {fs}"))
    from opsmith._cache._admin import format_size
    probe = _write_probe(existing)
    if probe is not None and probe.errno == errno.ENOSPC or free < _NO_SPACE:
        full = probe is not None and probe.errno == errno.ENOSPC
        rows.append(Check("cache free space", PROBLEM, f"the disk is full ({format_size(free)} free)" if full
                          else f"only {format_size(free)} free: a build needs more",
                          f"Free space: opsmith cache prune --max-size 2G, {env_fix.replace('or ', '')}."))
    elif probe is not None:
        rows.append(Check("cache free space", PROBLEM, f"cannot write there: {probe.strerror}",
                          f"Fix the permissions of {existing}, {env_fix}."))
    elif free < _LOW_SPACE:
        rows.append(Check("cache free space", WARNING, f"{format_size(free)} free",
                          "Free space (opsmith cache prune --max-size 1G) or move OPSMITH_CACHE_DIR: "
                          "a CUDA extension build can need several hundred MB."))
    else:
        rows.append(Check("cache free space", OK, f"{format_size(free)} free"))
    if existing == root and (root / "entries").is_dir():
        from opsmith._cache._admin import stats
        from opsmith._cache._open import open_cache
        try:
            s = stats(open_cache(root), os.fspath(root))
        except (OpsmithError, OSError) as exc:
            rows.append(Check("cache contents", WARNING, f"cannot be listed: {exc}",
                              "Run opsmith cache verify."))
        else:
            rate = f", hit rate {s.hit_rate:.0%}" if s.hit_rate is not None else ""
            rows.append(Check("cache contents", OK, f"{s.entries} entr{'y' if s.entries == 1 else 'ies'}, "
                              f"{format_size(s.bytes)}{rate}"))
    return rows


def check_settings(ctx: _Context) -> list[Check]:
    rows, shown = [], []
    for s in settings.describe():
        try:
            getattr(settings, s.name)
        except ConfigError as exc:
            rows.append(Check("settings", PROBLEM, f"{s.name} is invalid", _fix_of(exc)))
            continue
        for var in s.env:
            if os.environ.get(var):
                shown.append(f"{var}={os.environ[var]}")
                break
    if not rows:
        from opsmith._toolchain._cxx import max_jobs
        rows.append(Check("settings", OK, (", ".join(shown) if shown else "all defaults")
                          + f"; {max_jobs()} parallel compile jobs"))
    return rows


def check_onnxruntime(ctx: _Context) -> list[Check]:
    """ONNX Runtime: the installed version and providers, whether the CUDA provider's libraries
    load (naming the missing one), whether the opsmith op libraries built here load."""
    from opsmith.onnx._doctor import doctor_rows
    return [Check(*row) for row in doctor_rows(settings.cache_path)]


CHECKS: tuple[Callable[[_Context], list[Check]], ...] = (
    check_settings, check_python, check_torch, check_compilers, check_ninja, check_cuda_home,
    check_nvcc, check_nvrtc, check_driver_and_gpus, check_arch_list, check_cache, check_onnxruntime,
)


class _Quiet(logging.Handler):
    """Keeps the library's warnings (said again in the table's rows) off the doctor's output."""

    def emit(self, record: logging.LogRecord) -> None:
        pass


def run_checks() -> list[Check]:
    """Run every check, in order. A check that crashes becomes a warning row, not a crash."""
    ctx = _Context()
    rows: list[Check] = []
    logger = logging.getLogger("opsmith")
    quiet = _Quiet()
    logger.addHandler(quiet)
    try:
        _run_all(ctx, rows)
    finally:
        logger.removeHandler(quiet)
    return rows


def _run_all(ctx: _Context, rows: list[Check]) -> None:
    for check in CHECKS:
        name = check.__name__[len("check_"):].replace("_", " ")
        try:
            rows.extend(check(ctx))
        except Exception as exc:  # noqa: BLE001 - a doctor reports, it does not crash
            rows.append(Check(name, WARNING, f"the check itself failed: {type(exc).__name__}: {exc}",
                              "Please report this at the opsmith issue tracker."))
