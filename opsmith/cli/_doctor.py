"""``opsmith doctor``: one table of everything a build needs, what was found, and the fix.

Each check returns rows (:class:`Check`): ``ok``, ``warning`` (a feature is unavailable or
something looks odd, builds still work) or ``problem`` (builds of some kind will fail). Every
warning and problem carries a one-line fix. Nothing is written anywhere: the cache directory
is probed with a temporary file that is removed again, and compilers are probed without the
store.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from opsmith._config import settings
from opsmith._errors import CacheError, ConfigError, OpsmithError, ToolchainError

__all__ = ["OK", "PROBLEM", "WARNING", "Check", "run_checks", "CHECKS"]

OK, WARNING, PROBLEM = "ok", "warning", "problem"
_LOW_SPACE = 1 << 30       # below this, a warning: a CUDA extension's objects take hundreds of MB
_NO_SPACE = 64 << 20       # below this, a problem: a torch PCH alone is ~100-400 MB
CUDA_EXTRA = "pip install 'opsmith[cuda]'"


@dataclasses.dataclass(frozen=True)
class Check:
    """One row of the doctor's table.

    Attributes
    ----------
    name : str
        What was checked ("ninja", "cache directory", ...).
    status : str
        ``"ok"``, ``"warning"`` or ``"problem"``.
    found : str
        What was found, in one line.
    fix : str
        How to fix it, one line (empty for ok rows).
    """

    name: str
    status: str
    found: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class _Context:
    """What one check learns that a later one needs (torch's CUDA version, the compiler, GPUs)."""

    def __init__(self) -> None:
        self.torch_cuda: str | None = None
        self.torch_ok = False
        self.cxx = None
        self.nvcc = None
        self.gpu_archs: list[str] = []


def _fix_of(exc: BaseException) -> str:
    """Our errors say what is wrong and then how to fix it; the whole message is the fix line."""
    return " ".join(str(exc).split())


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, LC_ALL="C"))
    except (OSError, subprocess.TimeoutExpired):
        return None


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


def check_cuda_home(ctx: _Context) -> list[Check]:
    try:
        home = settings.cuda_home
    except ConfigError as exc:  # pragma: no cover - str settings never fail to parse
        return [Check("CUDA_HOME", PROBLEM, "invalid", _fix_of(exc))]
    var = "CUDA_HOME" if os.environ.get("CUDA_HOME") else "CUDA_PATH"
    if home:
        if not os.path.isdir(home):
            return [Check("CUDA_HOME", PROBLEM, f"{var}={home}, which does not exist",
                          f"Point {var} at the CUDA toolkit's root (the directory holding bin/nvcc), "
                          f"e.g. export {var}=/usr/local/cuda, or unset it.")]
        if not os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return [Check("CUDA_HOME", PROBLEM, f"{var}={home} has no bin/nvcc",
                          f"Point {var} at the CUDA toolkit's root (the directory holding bin/nvcc), "
                          f"or install the toolkit there.")]
        return [Check("CUDA_HOME", OK, f"{var}={home}")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        return [Check("CUDA_HOME", OK, f"unset; the toolkit is found through nvcc on PATH ({nvcc})")]
    if os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        return [Check("CUDA_HOME", OK, "unset; the toolkit is found at /usr/local/cuda")]
    status = PROBLEM if ctx.torch_cuda else WARNING
    return [Check("CUDA_HOME", status, "unset, and no CUDA toolkit on PATH or in /usr/local/cuda",
                  "Install the CUDA toolkit (the version torch was built with) and set "
                  "CUDA_HOME to its root, e.g. export CUDA_HOME=/usr/local/cuda; only CUDA "
                  "extensions (.cu sources) need it.")]


def check_nvcc(ctx: _Context) -> list[Check]:
    try:
        from opsmith._toolchain._nvcc import find_nvcc
    except ImportError:
        return [Check("nvcc", WARNING, "check unavailable (this opsmith has no nvcc module)",
                      "Upgrade opsmith.")]
    status = PROBLEM if ctx.torch_cuda else WARNING
    try:
        nvcc = find_nvcc(ctx.cxx)
    except ToolchainError as exc:
        return [Check("nvcc", status, "not found or not usable" + ("" if ctx.torch_cuda else
                      " (only CUDA extensions need it)"), _fix_of(exc))]
    ctx.nvcc = nvcc
    rows = [Check("nvcc", OK, f"{nvcc.version} ({nvcc.path})")]
    rows += _cuda_versions(ctx, nvcc)
    return rows


def _major_minor(version: str | None) -> tuple[int, int] | None:
    try:
        parts = str(version).split(".")
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        return None


def _torch_index(cuda_version: str) -> str:
    """PyTorch's wheel index for a CUDA version: ``13.0`` -> ``.../whl/cu130``."""
    mm = _major_minor(cuda_version)
    tag = f"cu{mm[0]}{mm[1]}" if mm else "cu130"
    return f"https://download.pytorch.org/whl/{tag}"


def _cuda_versions(ctx: _Context, nvcc) -> list[Check]:
    """torch's CUDA against the toolkit's: a major difference breaks builds, a minor one does not."""
    if not ctx.torch_cuda:
        return [Check("CUDA versions", WARNING, f"torch is a CPU-only build: CUDA extensions compile with "
                      f"nvcc {nvcc.version} but cannot use the GPU through torch",
                      f"Install a CUDA build of torch for the toolkit's CUDA {nvcc.version}, e.g. pip install "
                      f"torch --index-url {_torch_index(nvcc.version)}")]
    t, n = _major_minor(ctx.torch_cuda), _major_minor(nvcc.version)
    if t is None or n is None:
        return []
    if t[0] != n[0]:
        return [Check("CUDA versions", PROBLEM, f"torch was built with CUDA {ctx.torch_cuda}, nvcc is "
                      f"{nvcc.version}: a different major version",
                      f"Install CUDA toolkit {t[0]}.x and point CUDA_HOME at it, or install the torch "
                      f"build for CUDA {n[0]}.x.")]
    if t != n:
        return [Check("CUDA versions", OK, f"torch {ctx.torch_cuda}, nvcc {nvcc.version}: a minor-version "
                      f"difference, which CUDA's minor-version compatibility supports (nothing to do)")]
    return [Check("CUDA versions", OK, f"torch and nvcc both CUDA {nvcc.version}")]


def check_nvrtc(ctx: _Context) -> list[Check]:
    import importlib.util
    try:
        spec = importlib.util.find_spec("cuda.bindings")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return [Check("NVRTC", WARNING, "cuda-bindings is not installed: opsmith.cuda_kernel and "
                      "compile_cuda are unavailable", f"Install it: {CUDA_EXTRA}")]
    try:
        from opsmith._build._nvrtc import nvrtc_version
        version = nvrtc_version()
    except ImportError:
        return [Check("NVRTC", WARNING, "check unavailable", "Upgrade opsmith.")]
    except ToolchainError as exc:
        return [Check("NVRTC", WARNING, "libnvrtc could not be loaded", _fix_of(exc))]
    return [Check("NVRTC", OK, f"{version} (cuda-bindings)")]


def _nvidia_smi_gpus() -> list[tuple[str, str, str]] | None:
    """[(index, name, compute capability)] from nvidia-smi, or None when it cannot answer."""
    if not shutil.which("nvidia-smi"):
        return None
    proc = _run(["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"])
    if proc is None or proc.returncode != 0:
        return None
    gpus = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append((parts[0], parts[1], parts[2]))
    return gpus


def _driver_gpus() -> list[tuple[str, str, str]]:
    import ctypes

    from opsmith._runtime import _driver
    lib = _driver.driver()
    count = ctypes.c_int()
    lib.cuDeviceGetCount(ctypes.byref(count))
    gpus = []
    for i in range(count.value):
        arch = _driver.device_arch(i)
        name = ctypes.create_string_buffer(256)
        dev = ctypes.c_int()
        lib.cuDeviceGet(ctypes.byref(dev), i)
        lib.cuDeviceGetName(name, 256, dev)
        cc = f"{arch[3:-1]}.{arch[-1]}"
        gpus.append((str(i), name.value.decode(errors="replace"), cc))
    return gpus


def check_driver_and_gpus(ctx: _Context) -> list[Check]:
    rows = []
    want = WARNING  # no GPU never blocks a build: code compiles without one
    try:
        from opsmith._runtime import _driver
        major, minor = _driver.driver_version()
    except ImportError:
        return [Check("CUDA driver", WARNING, "check unavailable", "Upgrade opsmith.")]
    except (ToolchainError, OpsmithError) as exc:
        rows.append(Check("CUDA driver", want, "no usable NVIDIA driver: GPU code can be compiled here "
                          "but not run", _fix_of(exc)))
        return rows + [Check("GPUs", want, "none visible",
                             "Run on a machine with an NVIDIA GPU and driver (check nvidia-smi and "
                             "CUDA_VISIBLE_DEVICES).")]
    rows.append(Check("CUDA driver", OK, f"supports CUDA {major}.{minor}"))
    gpus = _nvidia_smi_gpus()
    if not gpus:
        try:
            gpus = _driver_gpus()
        except (OpsmithError, AttributeError, OSError):
            gpus = []
    if not gpus:
        rows.append(Check("GPUs", want, "none visible",
                          "Check nvidia-smi and CUDA_VISIBLE_DEVICES."))
    for idx, name, cc in gpus:
        ctx.gpu_archs.append("sm_" + cc.replace(".", ""))
        rows.append(Check(f"GPU {idx}", OK, f"{name}, compute capability {cc} (sm_{cc.replace('.', '')})"))
    return rows


def _arch_text(archs) -> str:
    return ", ".join(f"sm_{a.num}" + ("+PTX" if a.ptx else "") for a in archs)


def check_arch_list(ctx: _Context) -> list[Check]:
    from opsmith._config import settings
    text = settings.cuda_arch_list or ""
    try:
        from opsmith._toolchain._archs import parse_arch_list, resolve_archs
    except ImportError:
        return [Check("TORCH_CUDA_ARCH_LIST", WARNING, f"{text!r}: check unavailable "
                      f"(this opsmith has no arch module)", "Upgrade opsmith.")]
    versions = tuple(v for v in (getattr(ctx.nvcc, "version", None), ctx.torch_cuda) if v)
    try:
        if ctx.nvcc is not None:  # what a build would do: parsed, and checked against this nvcc
            archs = resolve_archs(text or None, nvcc_archs=tuple(ctx.nvcc.archs), cuda_versions=versions)
        elif text.strip() and text.strip() != "native":
            archs = parse_arch_list(text, gpus=[a[3:-1] + "." + a[-1] for a in ctx.gpu_archs],
                                    cuda_versions=versions)
        else:
            archs = None
    except ConfigError as exc:
        return [Check("TORCH_CUDA_ARCH_LIST", PROBLEM, f"{text!r} is invalid", _fix_of(exc))]
    if not text.strip():
        gpus = ", ".join(ctx.gpu_archs) if ctx.gpu_archs else "no GPU visible"
        shown = f": builds target {_arch_text(archs)}" if archs else ""
        return [Check("TORCH_CUDA_ARCH_LIST", OK, f"unset ({gpus}){shown}")]
    found = f"{text!r} -> {_arch_text(archs) if archs else text}"
    gpus = [a[3:-1] + "." + a[-1] for a in ctx.gpu_archs]
    try:
        from opsmith._toolchain._archs import _can_run
    except ImportError:
        _can_run = None
    if archs and gpus and _can_run is not None and not any(_can_run(a, g) for a in archs for g in gpus):
        return [Check("TORCH_CUDA_ARCH_LIST", WARNING, f"{found}: none of the GPUs here "
                      f"({', '.join(ctx.gpu_archs)}) can run that code ('no kernel image is available')",
                      f"Set TORCH_CUDA_ARCH_LIST={';'.join(sorted(set(gpus)))} (add it to the list to "
                      f"build for other machines too), or unset it to build for the GPUs here.")]
    return [Check("TORCH_CUDA_ARCH_LIST", OK, found)]


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
    from opsmith._onnx._session import doctor_rows
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
