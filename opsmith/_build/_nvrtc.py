"""NVRTC: CUDA C++ source to a cubin (or PTX), cached in the store.

Data flow::

    compile_cuda(source, ...)  ->  CompileRequest (canonical, hashable)
        -> cache key: source bytes, every reachable user header's bytes, options,
           NVRTC identity and version, target arch, opsmith version
        -> store hit: read the cubin, no NVRTC call (libnvrtc is not even loaded)
        -> miss: lock, look again, nvrtcCompileProgram, publish the entry atomically
    ->  CudaBinary (the code bytes, lowered names of the name expressions, the log)

The NVRTC version costs a 25 ms library load to ask, so a warm load must not ask it.
The store keeps a record of the library last used (its path, size, mtime and version):
a hit stats that one file, and a new NVRTC (another file, or the same path rewritten)
changes the key.
"""
from __future__ import annotations

import importlib
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opsmith._config import on_reset
from opsmith._errors import CompileError, SpecError, ToolchainError
from opsmith._cache._keys import KeyBuilder
from opsmith._record import Record
from opsmith._version import __version__

__all__ = ["CompileRequest", "CudaBinary", "compile_cuda", "normalize_arch", "nvrtc_version",
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
_identity: tuple[str, int, int, str] | None = None  # (path, size, mtime_ns, version)


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


def _loaded_nvrtc_path() -> str | None:
    """The file of the libnvrtc mapped into this process (Linux), else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if "/libnvrtc.so" in path or "/libnvrtc64" in path:
                    return path
    except OSError:
        pass
    return None


def _stat_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _nvrtc_identity(state) -> tuple[str, int, int, str]:
    """(library path, size, mtime_ns, version) of the NVRTC that compiles here, cheaply.

    A machine-local record remembers the last library seen; when its file is unchanged the
    answer costs one stat and libnvrtc stays unloaded.
    """
    global _identity
    if _identity is not None:
        return _identity
    def probe() -> dict:
        version = nvrtc_version()
        path = _loaded_nvrtc_path() or "<unknown libnvrtc>"
        size, mtime = _stat_id(path) or (0, 0)
        return {"path": path, "size": size, "mtime_ns": mtime, "version": version}

    from opsmith._cache._state import memo
    rec = memo(state, "nvrtc", "identity", probe,
               valid=lambda d: d["size"] and _stat_id(d["path"]) == (d["size"], d["mtime_ns"]))
    _identity = (rec["path"], rec["size"], rec["mtime_ns"], rec["version"])
    return _identity


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

    def key(self, nvrtc_id: tuple[str, int, int, str]) -> str:
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
        path, size, mtime, version = nvrtc_id
        kb.str("nvrtc.version", version).str("nvrtc.lib", f"{path}:{size}:{mtime}")
        return kb.hexdigest()


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
    elif defines is not None:
        for d in defines:
            k, _, v = str(d).partition("=")
            defs.append((k, v if _ else None))
    return CompileRequest(
        source=text, name=name, arch=normalize_arch(arch), output=output, std=std,
        options=tuple(str(o) for o in options),
        include_paths=tuple(os.path.abspath(os.fspath(p)) for p in include_paths),
        defines=tuple(sorted(defs)), headers=tuple(sorted((headers or {}).items())),
        name_expressions=tuple(dict.fromkeys(name_expressions)), source_dir=source_dir)


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
    from opsmith._cache._open import open_cache
    cache = open_cache()
    store = cache.store
    ident = _nvrtc_identity(cache.state)
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
                    binary = _compile(req, key, ident[3])
                    _publish(cache, binary, req)
        _memo[key] = binary
    return binary


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
        opts = req.nvrtc_options()
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
    global _identity
    _identity = None
    _memo.clear()


on_reset(_forget)
