"""nvcc: finding it, checking it against the host compiler and torch, and its flags.

Found from ``CUDACXX`` (a path to nvcc, as CMake reads it), ``CUDA_HOME``/``CUDA_PATH``,
``nvcc`` on ``PATH``, ``/usr/local/cuda``, then the pip wheel (``nvidia-cuda-nvcc``). The
probe (``--version``, ``--list-gpu-arch`` and a ``--dryrun`` that says where nvcc looks for
headers and libraries) runs once per nvcc binary and host compiler and is remembered in the
state's records, so that a warm load in a fresh process runs no subprocess.

Checks made before nvcc ever runs, each a :class:`ToolchainError` with the fix: no nvcc, a
``CUDA_HOME`` without nvcc, a host compiler outside the range this nvcc supports, and a
CUDA toolkit whose major version differs from torch's (a minor difference is a logged note).
"""
from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile

from opsmith._config import on_reset as _on_reset
from opsmith._cache._stamps import stamp_of
from opsmith._config import settings
from opsmith._record import Record
from opsmith._errors import ToolchainError
from opsmith._cache._keys import KeyBuilder
from opsmith._toolchain._cxx import _which, Compiler, probe_compiler

__all__ = ["Nvcc", "find_nvcc", "COMMON_NVCC_FLAGS", "TORCH_HEADERS_HINT", "hint_torch_headers",
           "explain_failure"]

log = logging.getLogger("opsmith.build")

_RECORD_NS = "toolchain"
_PROBE_FORMAT = 1

# torch's own (torch/utils/cpp_extension.py): kept so that .cu files compile as under torch.
COMMON_NVCC_FLAGS = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                     "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                     "--expt-relaxed-constexpr")

# Host compilers each CUDA release accepts: (min, max exclusive), as torch's tables.
_GCC_BOUNDS = {"12.0": (6, 13), "12.1": (6, 13), "12.2": (6, 13), "12.3": (6, 14), "12.4": (6, 14),
               "12.5": (6, 14), "12.6": (6, 14), "12.7": (6, 14), "12.8": (6, 15), "12.9": (6, 15),
               "13.0": (6, 16)}
_CLANG_BOUNDS = {"12.0": (7, 15), "12.1": (7, 15), "12.2": (7, 16), "12.3": (7, 16), "12.4": (7, 17),
                 "12.5": (7, 18), "12.6": (7, 18), "12.7": (7, 19), "12.8": (7, 19), "12.9": (7, 19),
                 "13.0": (7, 21)}

# Measured on the H100 machine (16 cores, gcc 13, nvcc 13.0, torch 2.11): see docs/cuda_extensions.md.
TORCH_HEADERS_HINT = (
    "{src} includes torch headers, so nvcc parses all of them three times (its host front end, "
    "its device front end and the host compiler; no precompiled header can help nvcc): 46-59 s "
    "of nvcc for the tutorial's ReLU written this way on a 16-core H100 machine (gcc 13, nvcc "
    "13.0), 34-50 s for the whole build with opsmith running the two front ends side by side, "
    "against about a second for the same kernel without torch headers. Faster layout: keep "
    "the kernel and a plain launcher (raw pointers, sizes) in the .cu "
    "with only <cuda_runtime.h>, and the torch-facing wrapper (torch::Tensor, checks, "
    "PYBIND11_MODULE) in a .cpp, which opsmith compiles with precompiled torch headers. See "
    "docs/cuda_extensions.md.")


class Nvcc(Record):
    """An nvcc and the host compiler it drives.

    Attributes
    ----------
    path : str
        The nvcc binary (or wrapper script) that is run.
    home : str
        The toolkit root nvcc reports (its ``TOP``).
    version : str
        ``"13.0"``.
    host : str
        The host compiler passed as ``-ccbin``.
    archs : tuple of str
        Compute capabilities this nvcc can build (``"7.5"``, ..., ``"12.1"``).
    include_dirs, lib_dirs : tuple of str
        CUDA's headers and libraries (cudart).
    fingerprint : str
        Identity of nvcc and its host compiler, for cache keys.
    """

    __slots__ = ("path", "home", "version", "version_text", "host", "host_family", "host_version",
                 "archs", "include_dirs", "lib_dirs", "cudart", "fingerprint")

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def link_flags(self) -> list[str]:
        """Linker flags for the CUDA runtime (libcudart), as torch links CUDA extensions."""
        return [*(f"-L{d}" for d in self.lib_dirs), self.cudart]

    def check_host(self, user_flags=()) -> None:
        """Refuse a host compiler this nvcc does not support, before nvcc refuses it."""
        if any("allow-unsupported-compiler" in f for f in user_flags):
            return
        table = _CLANG_BOUNDS if self.host_family == "clang" else _GCC_BOUNDS
        if self.host_family not in ("gcc", "clang"):
            return
        bounds = table.get(self.version)
        if bounds is None:
            known = max(table, key=lambda v: tuple(int(x) for x in v.split(".")))
            if tuple(int(x) for x in self.version.split(".")) < tuple(int(x) for x in known.split(".")):
                return  # older than any we know: nvcc's own check decides
            bounds = table[known]
        try:
            major = int(self.host_version.split(".")[0])
        except ValueError:
            return
        lo, hi = bounds
        if lo <= major < hi:
            return
        which = "g++" if self.host_family == "gcc" else "clang++"
        raise ToolchainError(
            f"nvcc {self.version} ({self.path}) supports {self.host_family} versions {lo} to {hi - 1} as "
            f"its host compiler, but the host compiler is {self.host} ({self.host_family} "
            f"{self.host_version}); nvcc would stop with 'unsupported {self.host_family.upper()} version'. "
            f"Fix: install a supported {which} (e.g. `apt-get install {which}-{hi - 1}`) and set "
            f"CC={which}-{hi - 1} (nvcc's host compiler, as torch reads it), or use a CUDA toolkit "
            f"that supports {self.host_family} {major}, or pass extra_cuda_cflags="
            f"['-allow-unsupported-compiler'] at your own risk.")


def torch_nvcc_std(tc) -> str:
    """The C++ standard torch's own builder passes to nvcc (read with the C++ one: ``TorchInfo``)."""
    return tc.torch.cuda_std


def has_ccbin(flags) -> bool:
    """Whether nvcc ``flags`` already name a host compiler (``-ccbin`` / ``--compiler-bindir``)."""
    return any(f in ("-ccbin", "--compiler-bindir") or f.startswith(("-ccbin=", "--compiler-bindir="))
               for f in flags)


# --- finding nvcc -------------------------------------------------------------------------------

def _pip_nvccs() -> list[str]:
    """nvcc from the pip wheels (``nvidia-cuda-nvcc``: nvidia/cu13/bin; the cu12 wheels: nvidia/cuda_nvcc/bin)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    out = []
    for root in (spec.submodule_search_locations or []) if spec else []:
        try:
            subdirs = sorted(os.listdir(root), reverse=True)
        except OSError:
            continue
        for sub in subdirs:
            if sub.startswith("cu") or sub == "cuda_nvcc":
                cand = os.path.join(root, sub, "bin", "nvcc")
                if os.path.isfile(cand) and os.access(cand, os.X_OK):
                    out.append(cand)
    return out


_DEFAULT_HOMES = ("/usr/local/cuda",)


def locate_nvcc(state=None) -> tuple[str, str]:
    """(path of nvcc, how it was found). Raises ToolchainError with the fix when there is none.

    PATH lookups go through ``_toolchain._which``: remembered in the machine-local state while PATH's
    directories are unchanged, so a warm load does not rescan PATH.
    """
    cudacxx = settings.cudacxx
    if cudacxx:
        path = _which(cudacxx, state) or cudacxx
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ToolchainError(f"CUDACXX={cudacxx!r} is not an executable nvcc. Point it at nvcc "
                                 f"(e.g. /usr/local/cuda/bin/nvcc) or unset it.")
        return os.path.abspath(path), "CUDACXX"
    home = settings.cuda_home
    if home:
        var = "CUDA_HOME" if os.environ.get("CUDA_HOME") else "CUDA_PATH"
        path = os.path.join(home, "bin", "nvcc")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, var
        hint = ""
        if os.path.isfile(os.path.join(home, "nvcc")):
            hint = f" ({home} looks like the bin directory: set {var}={os.path.dirname(home.rstrip('/'))})"
        elif not os.path.isdir(home):
            hint = f" ({home} does not exist)"
        found = shutil.which("nvcc")
        also = f" An nvcc is on PATH at {found}: unset {var} to use it." if found else ""
        raise ToolchainError(f"{var}={home} has no nvcc ({path} is missing){hint}. Set {var} to the "
                             f"CUDA toolkit root, the directory holding bin/nvcc (e.g. /usr/local/cuda)."
                             f"{also}")
    found = _which("nvcc", state)
    if found:
        return found, "PATH"
    for h in _DEFAULT_HOMES:
        path = os.path.join(h, "bin", "nvcc")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, h
    pips = _pip_nvccs()
    if pips:
        return pips[0], "pip package nvidia-cuda-nvcc"
    raise ToolchainError(
        "nvcc (the CUDA compiler) was not found: CUDA_HOME and CUDACXX are unset, no nvcc is on PATH, "
        "none is in /usr/local/cuda, and the pip package nvidia-cuda-nvcc is not installed. .cu sources "
        "need it. Fix: install the CUDA toolkit matching torch's CUDA version (torch.version.cuda) and "
        "set CUDA_HOME to its root (e.g. export CUDA_HOME=/usr/local/cuda), or `pip install "
        "nvidia-cuda-nvcc nvidia-cuda-cccl` (CUDA 13; for CUDA 12: nvidia-cuda-nvcc-cu12), or "
        "`conda install -c nvidia cuda-nvcc`.")


def find_nvcc(cxx: Compiler, state=None) -> Nvcc:
    """The nvcc to use with host compiler ``cxx``'s family, checked against torch's CUDA."""
    path, how = locate_nvcc(state)
    host = _host_compiler(cxx, state)
    try:
        st = os.stat(path)
    except OSError:
        raise ToolchainError(f"nvcc at {path} cannot be read. Reinstall the CUDA toolkit.") from None
    ident = KeyBuilder("nvcc-probe").str("path", path).str("real", os.path.realpath(path)).str(
        "stat", repr(stamp_of(st))).str("host", host).str(
        "fmt", str(_PROBE_FORMAT)).hexdigest()
    nv = _probe_cached(path, host, ident, state)
    _check_torch(nv.version, how, path)
    return nv


def _host_compiler(cxx: Compiler, state=None) -> str:
    cc = settings.cc  # torch passes $CC to nvcc as -ccbin; so do we
    if cc:
        return _which(cc, state) or cc
    if cxx.family == "gcc":
        return cxx.path
    return _which("g++", state) or cxx.path  # nvcc's default and best-tested host compiler


@functools.lru_cache(maxsize=None)
def _probe_cached(path: str, host: str, ident: str, state) -> Nvcc:
    from opsmith._cache._state import memo

    def nvcc_of(doc: dict) -> Nvcc:
        return Nvcc(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()})
    doc = memo(state, _RECORD_NS, "nvcc-" + ident, lambda: _run_probe(path, host, state)._asdict(),
               valid=lambda d: nvcc_of(d) is not None)
    return nvcc_of(doc)


def _run(cmd, cwd=None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, errors="replace", cwd=cwd, timeout=120,
                              env=dict(os.environ, LC_ALL="C"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"nvcc at {cmd[0]} could not be run ({exc}). Reinstall the CUDA toolkit "
                             f"or point CUDA_HOME at a working one.") from None


def _run_probe(path: str, host: str, state) -> Nvcc:
    out = _run([path, "--version"])
    text = out.stdout + out.stderr
    m = re.search(r"release (\d+)\.(\d+)", text)
    if out.returncode != 0 or m is None:
        raise ToolchainError(f"`{path} --version` failed or printed no CUDA release:\n{text.strip()[-1500:]}\n"
                             f"Reinstall the CUDA toolkit or point CUDA_HOME at a working one.")
    version = f"{m[1]}.{m[2]}"
    lst = _run([path, "--list-gpu-arch"])
    archs = sorted({f"{int(n) // 10}.{int(n) % 10}" for n in re.findall(r"compute_(\d+)\b", lst.stdout)},
                   key=lambda s: tuple(int(x) for x in s.split(".")))
    host_c = probe_compiler(host, state) if os.path.isabs(host) else None
    with tempfile.TemporaryDirectory(prefix="opsmith-nvcc-") as d:
        with open(os.path.join(d, "probe.cu"), "w") as f:
            f.write("__global__ void k() {}\n")
        dry = _run([path, "-ccbin", host, "--dryrun", "-c", "probe.cu", "-o", "probe.o"], cwd=d)
    top, incs, libs = _parse_dryrun(dry.stdout + dry.stderr)
    if top is None:
        top = os.path.dirname(os.path.dirname(os.path.realpath(path)))
    top = os.path.realpath(top)
    # pip wheels keep headers in TOP/include and TOP/include/cccl, which nvcc's profile does not name
    for extra in (os.path.join(top, "include"), os.path.join(top, "include", "cccl")):
        if extra not in incs:
            incs.append(extra)
    incs = [os.path.realpath(i) for i in incs if os.path.isdir(i)]
    incs = list(dict.fromkeys(incs))
    libs = [os.path.realpath(x) for x in [*libs, os.path.join(top, "lib64"), os.path.join(top, "lib")]
            if os.path.isdir(x) and not x.rstrip("/").endswith("stubs")]
    libs = list(dict.fromkeys(libs))
    cudart = "-lcudart"
    if not any(os.path.exists(os.path.join(x, "libcudart.so")) for x in libs):
        for x in libs:
            versioned = sorted(n for n in os.listdir(x) if re.fullmatch(r"libcudart\.so\.\d+", n))
            if versioned:
                cudart = f"-l:{versioned[-1]}"  # wheels ship only libcudart.so.N
                break
    if not any(os.path.isfile(os.path.join(i, "cuda_runtime.h")) for i in incs):
        raise ToolchainError(
            f"nvcc {version} at {path} has no CUDA runtime headers (cuda_runtime.h) in {', '.join(incs) or top}. "
            f"Install them: with a pip-installed nvcc, `pip install nvidia-cuda-runtime nvidia-cuda-cccl` "
            f"(same CUDA version); otherwise reinstall the CUDA toolkit.")
    fp = KeyBuilder("nvcc").str("path", path).str("real", os.path.realpath(path)).str("version", text).str(
        "host", host).str("host-fp", host_c.fingerprint if host_c else host).strs("includes", incs).hexdigest()
    return Nvcc(path, top, version, text.strip(), host, host_c.family if host_c else "unknown",
                host_c.version if host_c else "0", tuple(archs), tuple(incs), tuple(libs), cudart, fp)


def _parse_dryrun(text: str):
    top, incs, libs = None, [], []
    for line in text.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:]
        if body.startswith("TOP="):
            top = body[4:].strip()
        elif body.startswith(("INCLUDES=", "SYSTEM_INCLUDES=")):
            incs += [p[2:] if p.startswith("-I") else p for p in re.findall(r'"([^"]+)"', body)
                     if p != "-isystem"]
        elif body.startswith("LIBRARIES="):
            libs += [p[2:] for p in re.findall(r'"(-L[^"]+)"', body)]
    return top, incs, libs


@functools.lru_cache(maxsize=None)
def _check_torch(nvcc_version: str, how: str, path: str) -> None:
    from opsmith._toolchain._cxx import torch_info
    tcuda = torch_info().cuda
    if not tcuda:
        log.warning("torch %s is a CPU-only build: CUDA sources compile with nvcc %s (%s), but the "
                    "extension cannot use the GPU with it. Install a CUDA build of torch "
                    "(https://pytorch.org/get-started/locally/).", torch_info().version, nvcc_version, path)
        return
    t_major, t_minor = (str(tcuda).split(".") + ["0"])[:2]
    n_major, n_minor = nvcc_version.split(".")[:2]
    if t_major != n_major:
        raise ToolchainError(
            f"the CUDA toolkit's nvcc is {nvcc_version} ({path}, found through {how}) but torch "
            f"{torch_info().version} was built with CUDA {tcuda}: an extension built with one major "
            f"version does not load into the other. Fix: install CUDA {t_major}.x and point CUDA_HOME at it "
            f"(or `pip install 'nvidia-cuda-nvcc=={t_major}.*' 'nvidia-cuda-cccl=={t_major}.*'` with "
            f"CUDA_HOME unset), or install a torch built for CUDA {n_major}.")
    if t_minor != n_minor:
        log.info("note: nvcc is CUDA %s and torch was built with CUDA %s: a minor version difference, "
                 "which works (CUDA keeps minor-version compatibility)", nvcc_version, tcuda)


# --- after the fact -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def hint_torch_headers(display: str) -> None:
    """Say once per process and source that a .cu including torch headers is slow, and the fix."""
    log.warning(TORCH_HEADERS_HINT.format(src=display))


def includes_torch_headers(text: bytes) -> bool:
    """Whether a CUDA source includes torch or ATen headers (``_spec.torch_includes``)."""
    from opsmith._spec import torch_includes
    return torch_includes(text)[1]


_EXPLAIN = (
    (r"Unsupported gpu architecture '(compute_\d+\w*)'",
     "nvcc cannot build {0}: set TORCH_CUDA_ARCH_LIST to compute capabilities this nvcc supports "
     "(`nvcc --list-gpu-arch`), e.g. 9.0 for H100, or unset it to build for the GPUs here; a CUDA "
     "version such as 12.0 is not a compute capability."),
    (r"unsupported (GNU|clang) version",
     "nvcc refused its host compiler's version: set CC to a supported g++ (see `nvcc --version` release "
     "notes) or pass extra_cuda_cflags=['-allow-unsupported-compiler']."),
    (r"cannot find .*lcudart|cannot find -lcudart",
     "libcudart was not found: point CUDA_HOME at a full CUDA toolkit, or `pip install nvidia-cuda-runtime`."),
)


def explain_failure(output: str) -> str | None:
    """A one-line fix for nvcc failures that have a known cause, or None."""
    for rx, text in _EXPLAIN:  # patterns compiled here, not at import: a warm load needs none
        m = re.search(rx, output)
        if m:
            return text.format(*m.groups())
    return None


@_on_reset
def _forget() -> None:
    _probe_cached.cache_clear()
