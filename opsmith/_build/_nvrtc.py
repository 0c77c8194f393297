"""NVRTC: CUDA C++ source to a cubin (or PTX), cached in the store.

Data flow::

    compile_cuda(source, ...)  ->  CompileRequest (canonical, hashable: _nvrtc_request)
        -> cache key: source bytes, every reachable user header's bytes, options,
           NVRTC's version and the sha256 of its library (_nvrtc_identity), target arch,
           opsmith version
        -> store hit: read the cubin, no NVRTC call (libnvrtc is not even loaded)
        -> miss: lock, look again, nvrtcCompileProgram, publish the entry atomically
    ->  CudaBinary (the code bytes, lowered names of the name expressions, the log)

The NVRTC version costs a 25 ms library load to ask, so a warm load must not ask it: the
machine-local state remembers the identity with the library file's stamp, and a hit stats
that one file (see :mod:`opsmith._build._nvrtc_identity`).
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from opsmith._build._nvrtc_identity import nvrtc_identity
from opsmith._build._nvrtc_request import CompileRequest, make_request, normalize_arch
from opsmith._config import on_reset
from opsmith._errors import CompileError, ToolchainError
from opsmith._record import Record

__all__ = ["CompileRequest", "CudaBinary", "compile_cuda", "normalize_arch", "nvrtc_version", "prebuilt",
           "nvrtc_stats", "INSTALL_HINT"]

log = logging.getLogger("opsmith.nvrtc")

INSTALL_HINT = "pip install 'opsmith[cuda]'  (installs cuda-bindings and nvidia-cuda-nvrtc)"

# NVRTC calls made by this process (tests count them to prove a cache hit compiled nothing).
nvrtc_stats = {"compiles": 0, "library_loads": 0}

# One lock per cache key, not one for the process: NVRTC is thread-safe, so different
# programs compile at once (compile_many) while two threads asking for one key compile it once.
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_memo: dict[str, CudaBinary] = {}
_nvrtc_mod: Any = None


# -- the library ------------------------------------------------------------------------------
def _nvrtc():
    """cuda.bindings.nvrtc with libnvrtc loaded, or a ToolchainError naming the package."""
    global _nvrtc_mod
    if _nvrtc_mod is not None:
        return _nvrtc_mod
    try:
        nvrtc = importlib.import_module("cuda.bindings.nvrtc")
    except ImportError as exc:
        raise ToolchainError(f"compiling CUDA kernels needs cuda-bindings, which is not "
                             f"importable ({exc}). Install it: {INSTALL_HINT}") from None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # cuda-bindings raises RuntimeError/OSError-like errors on dlopen
        raise ToolchainError(f"the NVRTC library (libnvrtc) could not be loaded: {exc}. "
                             f"Install it: {INSTALL_HINT}, or put a CUDA toolkit's lib64 on "
                             f"LD_LIBRARY_PATH.") from None
    nvrtc_stats["library_loads"] += 1
    _nvrtc_mod = nvrtc
    return nvrtc


def nvrtc_version() -> str:
    """The version of the NVRTC library that compiles here, as ``"13.5"``.

    Loads libnvrtc (about 25 ms the first time).
    """
    nvrtc = _nvrtc()
    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


class CudaBinary(Record):
    """What NVRTC made: the code, its kind and arch, and the lowered names of name expressions.

    Examples
    --------
    >>> b = compile_cuda('extern "C" __global__ void k(float* x) {}', arch="sm_90")  # doctest: +SKIP
    >>> b.kind, b.arch, b.code[:4]                                                  # doctest: +SKIP
    ('cubin', 'sm_90', b'\\x7fELF')
    """

    __slots__ = ("code", "kind", "arch", "lowered_names", "nvrtc_version", "log", "key", "source",
                 "name", "from_cache")
    _defaults = {"source": "", "name": "<cuda source>", "from_cache": False}

    def __repr__(self) -> str:
        return (f"CudaBinary(kind={self.kind!r}, arch={self.arch!r}, {len(self.code)} bytes, "
                f"name={self.name!r}, lowered_names={dict(self.lowered_names)!r}, "
                f"nvrtc_version={self.nvrtc_version!r}, from_cache={self.from_cache})")

    def __hash__(self) -> int:
        return hash(("CudaBinary", self.key, self.kind, self.arch))

    def __eq__(self, other: object) -> bool:
        if type(other) is not CudaBinary:
            return NotImplemented
        return (self.key, self.kind, self.code) == (other.key, other.kind, other.code)


# -- compile ----------------------------------------------------------------------------------
def compile_cuda(source: str | os.PathLike, *, arch: str, **kwargs: Any) -> CudaBinary:
    """Compile CUDA C++ with NVRTC, or take the result from the store.

    Parameters
    ----------
    source : str or path-like
        CUDA C++ text, or the path of a ``.cu`` file (its directory is an include path).
    arch : str
        Target, e.g. ``"sm_90"``. A cubin is made for exactly this arch.
    output : {"cubin", "ptx"}
    std : str or None
        C++ standard, default ``"c++17"``.
    options, include_paths, defines, headers, name_expressions, name
        NVRTC options; include directories; macros (a mapping or ``["N=4"]``); in-memory
        headers ``{"name.h": text}``; C++ names to lower (``"scale<float>"``); the name
        NVRTC prints in errors.

    Returns
    -------
    CudaBinary

    Examples
    --------
    >>> b = compile_cuda('extern "C" __global__ void k(float* x) {}', arch="sm_90")  # doctest: +SKIP
    >>> b.kind                                                                       # doctest: +SKIP
    'cubin'
    """
    req = make_request(source, arch=arch, **kwargs)
    return compile_request(req)


def compile_request(req: CompileRequest) -> CudaBinary:
    pre = prebuilt(req)  # an installed opsmith package's binary: no NVRTC, no cache
    if pre is not None:
        return pre
    from opsmith._cache._open import open_cache
    cache = open_cache()
    store = cache.store
    ident = nvrtc_identity(cache.state, nvrtc_version)
    key = req.key(ident)
    hit = _memo.get(key)
    if hit is not None:
        return hit
    with _locks_guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        hit = _memo.get(key)
        if hit is not None:  # another thread compiled it while this one waited
            return hit
        binary = _from_store(store, key, req)
        if binary is None:
            with cache.locks.hold(key), store.build_lease(key):
                binary = _from_store(store, key, req)
                if binary is None:
                    from opsmith._cache._tiered import check_must_hit
                    check_must_hit(key, f"compiling {req.name} with NVRTC")
                    binary = _compile(req, key, ident.version)
                    _publish(cache, binary, req)
        _memo[key] = binary
    return binary


def prebuilt(req: CompileRequest, any_arch: bool = False) -> CudaBinary | None:
    """``req``'s binary from an installed opsmith package (:mod:`opsmith._build._prebuilt`), or
    None; ``any_arch``: whatever arch it has (a machine with no GPU reads the names from it)."""
    from opsmith._build import _prebuilt
    found = _prebuilt.any_binary(req) if any_arch else _prebuilt.lookup(req)
    if found is None:
        return None
    return CudaBinary(**found, log="", source=req.source, name=req.name, from_cache=True)


def _binary_arch(req: CompileRequest) -> str:
    """What the code is for: ``sm_90`` for a cubin, ``compute_90`` for PTX (a virtual arch)."""
    return req.arch if req.output == "cubin" else req.arch.replace("sm_", "compute_", 1)


def _supported_archs() -> list[int]:
    """The archs this NVRTC can target (``[75, 80, ..., 121]``), or [] if it cannot say."""
    try:
        nvrtc = _nvrtc()
        res, archs = nvrtc.nvrtcGetSupportedArchs()
        if res == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return sorted(int(a) for a in archs)
    except Exception:  # noqa: BLE001 - only a better message is lost
        pass
    return []


def _arch_error(req: CompileRequest, text: str, opts: Sequence[str]) -> CompileError:
    archs = _supported_archs()
    span = (f"this NVRTC supports sm_{archs[0]} to sm_{archs[-1]} ({', '.join(f'sm_{a}' for a in archs)})"
            if archs else "this NVRTC does not support it")
    hint = f"; for example arch='sm_{90 if 90 in archs else archs[-1]}'" if archs else ""
    return CompileError(
        f"NVRTC cannot compile {req.name} for {_binary_arch(req)}: {span}. Pass an arch in that "
        f"range{hint} (or set OPSMITH_CUDA_ARCH); an older GPU needs an older NVRTC "
        f"(pip install 'nvidia-cuda-nvrtc==12.*').\nNVRTC said: {text.strip()}\nNVRTC options: {' '.join(opts)}",
        command=["nvrtc", *opts], output=text, source=req.name, options=list(opts))


def _fname(kind: str) -> str:
    return "kernel.cubin" if kind == "cubin" else "kernel.ptx"


def _from_store(store, key: str, req: CompileRequest) -> CudaBinary | None:
    entry = store.get(key)
    if entry is None:
        return None
    meta = entry.meta
    try:
        code = entry.file(_fname(req.output)).read_bytes()
    except (KeyError, OSError):
        return None
    return CudaBinary(code=code, kind=req.output, arch=_binary_arch(req),
                      lowered_names=dict(meta.get("lowered_names", {})),
                      nvrtc_version=meta.get("nvrtc_version", "?"), log=meta.get("log", ""),
                      key=key, source=req.source, name=req.name, from_cache=True)


def _publish(cache, binary: CudaBinary, req: CompileRequest) -> None:
    build = cache.workspace.build_dir("nvrtc")
    try:
        path = build / _fname(binary.kind)
        path.write_bytes(binary.code)
        cache.store.put(binary.key, {path.name: path}, kind=binary.kind, name=req.name, move=True,
                  meta={"lowered_names": dict(binary.lowered_names), "arch": binary.arch,
                        "nvrtc_version": binary.nvrtc_version, "log": binary.log[:20000],
                        "options": req.nvrtc_options()})
    finally:
        import shutil
        shutil.rmtree(build, ignore_errors=True)


def _check(nvrtc, result, what: str) -> None:
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(result)
        raise ToolchainError(f"NVRTC {what} failed: {msg.decode(errors='replace')}")


def _compile(req: CompileRequest, key: str, version: str) -> CudaBinary:
    from opsmith._config import configure_logging
    configure_logging()
    nvrtc = _nvrtc()
    hnames = [n.encode() for n, _ in req.headers]
    hsrcs = [s.encode() for _, s in req.headers]
    err, prog = nvrtc.nvrtcCreateProgram(req.source.encode(), req.name.encode(), len(hnames),
                                         hsrcs, hnames)
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in req.name_expressions:
            _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, expr.encode())[0],
                   f"nvrtcAddNameExpression({expr!r})")
        opts = _without_nvrtc_cache(req.nvrtc_options(), tuple(nvrtc.nvrtcVersion()[1:]))
        with _locks_guard:
            nvrtc_stats["compiles"] += 1
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        # bytearray, never b" " * size: NVRTC writes into the buffer, and a 1-byte bytes
        # object is CPython's shared singleton (writing into it corrupts the interpreter)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(max(size, 1))
        nvrtc.nvrtcGetProgramLog(prog, buf)
        text = bytes(buf).rstrip(b"\x00 ").decode(errors="replace")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(req, text, opts)
        if text.strip():
            log.info("NVRTC log for %s:\n%s", req.name, text)
        if req.output == "cubin":
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            code = bytearray(size)
            _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, code)[0], "nvrtcGetCUBIN")
        else:
            _, size = nvrtc.nvrtcGetPTXSize(prog)
            code = bytearray(size)
            _check(nvrtc, nvrtc.nvrtcGetPTX(prog, code)[0], "nvrtcGetPTX")
        lowered = {}
        for expr in req.name_expressions:
            res, low = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(nvrtc, res, f"nvrtcGetLoweredName({expr!r})")
            lowered[expr] = low.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if req.output == "ptx":
        code = code.rstrip(b"\x00")
    return CudaBinary(code=bytes(code), kind=req.output, arch=_binary_arch(req), lowered_names=lowered,
                      nvrtc_version=version, log=text, key=key, source=req.source, name=req.name)


def _ptxas_verbose(opts: Sequence[str]) -> bool:
    """Whether ``opts`` ask ptxas for its report (``--ptxas-options=-v``, ``-Xptxas --verbose`` ...)."""
    for flag, value in zip(["", *opts], opts):  # "--ptxas-options=-v", or the flag and "-v" as two options
        if flag in ("--ptxas-options", "-Xptxas"):
            words = value
        elif value.startswith(("--ptxas-options=", "-Xptxas=")):
            words = value.split("=", 1)[1]
        else:
            continue
        if {"-v", "--verbose"} & set(words.replace(",", " ").split()):
            return True
    return False


def _without_nvrtc_cache(opts: list[str], version: tuple[int, int]) -> list[str]:
    """``opts`` plus ``--no-cache`` where ptxas' report is asked for and NVRTC (12.9 on) has its own
    cache: a program NVRTC finds there is not run through ptxas, and its log comes back empty."""
    if version >= (12, 9) and "--no-cache" not in opts and _ptxas_verbose(opts):
        return [*opts, "--no-cache"]
    return opts


def _compile_error(req: CompileRequest, text: str, opts: Sequence[str]) -> CompileError:
    """The NVRTC log as a CompileError that leads with the first error at the user's line."""
    if "--gpu-architecture" in text and "invalid value" in text:
        return _arch_error(req, text, opts)
    from opsmith._build._diagnostics import nvrtc_error
    hint = ""
    if "could not open source file" in text or "cannot open source file" in text:
        hint = "Add the header's directory to include_paths=, or pass it in headers={name: text}."
    return nvrtc_error(text, name=req.name, source=req.source, options=list(opts), hint=hint)


def _forget() -> None:
    _memo.clear()


on_reset(_forget)
