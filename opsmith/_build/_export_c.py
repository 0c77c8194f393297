"""``export_c``: CUDA kernels to a C library that needs no Python, torch or libcuda at link time.

Data flow::

    sources + kernel names  ->  declarations (parse_kernels) -> KernelSignature per kernel
    archs (default: common ones NVRTC supports, + PTX of the newest)
        -> one NVRTC compile per (source, arch), cached in the store; misses run in parallel
    ->  <prefix>.h     one typed launch function per kernel, load/unload/error_string, attributes
        <prefix>.c     every image embedded as a string literal, a per-arch table picked at load
        <prefix>.json  the manifest: kernels, signatures, archs, static resources, cache keys
        lib<prefix>.a / lib<prefix>.so   when asked (the system C compiler, build_c_library)

The C text lives in :mod:`opsmith._build._export_c_template`; this module fills it in.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opsmith._build._run import run_tool
from opsmith._errors import SpecError, ToolchainError
from opsmith._record import Record
from opsmith._version import __version__

__all__ = ["export_c", "CExport", "default_archs", "build_c_library", "embed_literal"]

log = logging.getLogger("opsmith.export_c")

# The common datacenter and consumer GPUs: T4, A100, RTX 30xx/A10, L4/RTX 40xx, H100,
# B200, RTX 50xx. Kept to those the installed NVRTC supports.
COMMON_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
MANIFEST_FORMAT = "opsmith.export-c"
MANIFEST_VERSION = 1
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_RESERVED = {"stream", "grid", "block", "shared_mem", "f", "r", "args"}  # names the launcher uses
# scalar spellings that are valid C (with stdint.h/stddef.h/stdbool.h); others map by dtype
_C_SCALARS = {"float", "double", "int", "signed", "signed int", "unsigned", "unsigned int", "long",
              "long int", "signed long", "unsigned long", "long long", "long long int", "signed long long",
              "unsigned long long", "unsigned long long int", "short", "short int", "signed short",
              "unsigned short", "char", "signed char", "unsigned char", "bool", "size_t", "ptrdiff_t",
              "intptr_t", "uintptr_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
              "uint32_t", "uint64_t"}
_BY_DTYPE = {"float32": "float", "float64": "double", "int32": "int32_t", "uint32": "uint32_t",
             "int64": "int64_t", "uint64": "uint64_t", "int16": "int16_t", "uint16": "uint16_t",
             "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}


class CExport(Record):
    """What :func:`export_c` wrote.

    ``header``, ``source``, ``manifest`` are paths; ``static_library`` and ``shared_library``
    are paths or None; ``kernels`` maps each kernel's name (``"scale<float>"``) to its launch
    function (``"opsmith_mylib_scale_float_launch"``); ``archs`` lists the embedded code
    (``"sm_90"``, ``"compute_120"`` for PTX); ``seconds`` the time of each step.
    """

    __slots__ = ("header", "source", "manifest", "static_library", "shared_library", "kernels", "archs",
                 "seconds")


# -- archs ------------------------------------------------------------------------------------
def _supported_archs() -> list[int]:
    """The ``sm_XY`` numbers the installed NVRTC compiles for (``[75, 80, ...]``)."""
    from opsmith._build import _nvrtc
    nvrtc = _nvrtc._nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError("NVRTC could not list the archs it supports (nvrtcGetSupportedArchs failed)")
    return sorted(int(a) for a in archs)


def _arch_number(arch: str) -> int:
    return int(re.sub(r"\D", "", arch))


def default_archs() -> tuple[str, ...]:
    """The default targets: :data:`COMMON_ARCHS` that the installed NVRTC supports.

    Examples
    --------
    >>> default_archs()  # doctest: +SKIP
    ('sm_75', 'sm_80', 'sm_86', 'sm_89', 'sm_90', 'sm_100', 'sm_120')
    """
    supported = set(_supported_archs())
    return tuple(a for a in COMMON_ARCHS if _arch_number(a) in supported)


def _resolve_archs(archs: Iterable[str | int] | None, ptx: bool) -> list[tuple[str, str]]:
    """[(arch, "cubin" | "ptx")]: the cubins, then the PTX of the newest when ``ptx``."""
    from opsmith._build._nvrtc import normalize_arch
    if archs is None:
        chosen = list(default_archs())
        if not chosen:
            raise ToolchainError(f"the installed NVRTC supports none of {', '.join(COMMON_ARCHS)}; "
                                 f"pass the archs to build for (archs=['sm_90'] or --arch sm_90)")
    else:
        if isinstance(archs, (str, int)):
            archs = [a for a in str(archs).replace(",", " ").split() if a]
        chosen = list(dict.fromkeys(normalize_arch(a) for a in archs))
        if not chosen:
            raise SpecError("archs is empty: name at least one, e.g. ['sm_90'], or leave it out for the "
                            "default list")
        supported = _supported_archs()
        bad = [a for a in chosen if _arch_number(a) not in supported]
        if bad:
            raise SpecError(f"the installed NVRTC cannot compile for {', '.join(bad)}; it supports "
                            f"{', '.join(f'sm_{a}' for a in supported)}. Pick from those, or install a "
                            f"newer NVRTC (pip install -U nvidia-cuda-nvrtc) for newer GPUs.")
    chosen.sort(key=lambda a: (_arch_number(a), a))
    out = [(a, "cubin") for a in chosen]
    if ptx:
        newest = max(chosen, key=_arch_number)
        out.append((re.sub(r"[af]$", "", newest), "ptx"))  # arch-specific PTX would run on one chip only
    return out


# -- kernels ----------------------------------------------------------------------------------
class _Kernel(Record):
    __slots__ = ("name", "cname", "module", "decl")


def _c_name(name: str) -> str:
    """``scale<float, 4>`` -> ``scale_float_4``."""
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", name)).strip("_")


def _find_kernels(requests, kernels: Sequence[str] | None) -> list[_Kernel]:
    from opsmith._runtime._signature import parse_kernels, split_name_expression
    decls = [parse_kernels(r.source) for r in requests]
    if kernels is None:
        out = [_Kernel(d.name, _c_name(d.name), m, d) for m, ds in enumerate(decls) for d in ds.values()
               if not d.template_params]
        if not out:
            templates = [d.name for ds in decls for d in ds.values()]
            raise SpecError("no kernel to export: " + (
                f"the sources declare only templates ({', '.join(templates)}); name the instantiations, "
                f"e.g. kernels=['{templates[0]}<float>'] (--kernel '{templates[0]}<float>')" if templates
                else "the sources declare no __global__ function"))
        return out
    if isinstance(kernels, str):
        kernels = [kernels]
    out = []
    for entry in kernels:
        alias, sep, expr = entry.partition("=")
        if not sep:
            alias, expr = "", entry
        expr = expr.strip()
        base, _targs = split_name_expression(expr)
        where = [m for m, ds in enumerate(decls) if base in ds]
        if not where:
            found = sorted({d for ds in decls for d in ds})
            raise SpecError(f"no kernel {base!r} in {_names(requests)}; the __global__ functions there are "
                            f"{', '.join(found) or 'none'}")
        if len(where) > 1:
            raise SpecError(f"kernel {base!r} is declared in {_names([requests[m] for m in where])}: "
                            f"export those sources separately (two libraries with different prefixes)")
        decl = decls[where[0]][base]
        if decl.template_params and len(_targs) != len(decl.template_params):
            example = f"{base}<{', '.join('float' for _ in decl.template_params)}>"
            raise SpecError(f"kernel {base!r} is a template <{', '.join(decl.template_params)}>: name an "
                            f"instantiation, e.g. '{example}' (--kernel '{example}')")
        cname = alias.strip() or _c_name(expr)
        if not re.fullmatch(_IDENT, cname):
            raise SpecError(f"{alias.strip()!r} is not a C identifier; name the kernel like 'scale_f=scale<float>'")
        out.append(_Kernel(expr, cname, where[0], decls[where[0]][base]))
    seen: dict[str, str] = {}
    for k in out:
        if k.cname in seen:
            raise SpecError(f"kernels {seen[k.cname]!r} and {k.name!r} would both be called {k.cname!r} in C; "
                            f"name one of them: '{k.cname}_2={k.name}'")
        seen[k.cname] = k.name
    return out


def _names(requests) -> str:
    return ", ".join(r.name for r in requests)


def _signature(kernel: _Kernel, lowered: Mapping[str, str]):
    from opsmith._runtime._signature import KernelSignature
    d = kernel.decl
    if kernel.name in lowered:
        symbol = lowered[kernel.name]
    elif d.extern_c and not d.template_params:
        symbol = d.name
    else:
        raise SpecError(f"kernel {kernel.name!r}: NVRTC gave no lowered name for it")
    sig = KernelSignature.from_decl(kernel.name, d, symbol)
    bad = sig.unsupported()
    if bad:
        raise SpecError(f"kernel {kernel.name!r}: {bad[0].describe()} has a type a C launcher cannot pass "
                        f"(supported: numbers and pointers). Pass a pointer instead, or export another kernel.")
    return sig


def _c_param(p, used: set[str]) -> str:
    """One parameter as C: qualifiers C does not know removed, unknown pointees as ``void``."""
    name = p.name if p.name not in _RESERVED else p.name + "_"
    while name in used:
        name += "_"
    used.add(name)
    decl = re.sub(r"\[[^\]]*\]\s*$", "", p.ctype.split("=")[0])
    words = re.findall(r"[A-Za-z_][\w:]*|\*", decl)
    if p.kind == "tensor":
        star = words.index("*") if "*" in words else len(words)
        const = "const" in words[:star]
        base = " ".join(w.split("::")[-1] for w in words[:star]
                        if w not in ("const", "volatile", "__restrict__", "__restrict", "restrict", "struct",
                                     "class", "typename", "__grid_constant__", p.name))
        ctype = base if base in _C_SCALARS else "void"
        return f"{'const ' if const else ''}{ctype} *{name}"
    base = " ".join(w.split("::")[-1] for w in words
                    if w not in ("const", "volatile", "register", "__grid_constant__", p.name, "*"))
    ctype = base if base in _C_SCALARS else _BY_DTYPE[_dtype_of(p)]
    return f"{ctype} {name}"


def _dtype_of(p) -> str:
    from opsmith._runtime._signature import _SCALARS
    for spelling, (dt, ct, _kind) in _SCALARS.items():
        if ct is p.ctypes_type:
            return dt
    return "int64"


# -- embedding --------------------------------------------------------------------------------
def embed_literal(name: str, data: bytes, line_bytes: int = 8192) -> str:
    """``data`` as a C array initialised by adjacent string literals of ``\\xHH`` escapes.

    Every byte is an escape, so no hex digit can run into the next one. This is the fast way
    both to write (``bytes.hex`` does the work in C) and to compile (a string literal is
    one token per line, where ``{0x7f, 0x45, ...}`` is two per byte).

    Examples
    --------
    >>> print(embed_literal("img", b"\\x7fEL"))
    static const unsigned char img[] OSM_ALIGNED =
    "\\x7f\\x45\\x4c";
    """
    lines = []
    for i in range(0, len(data), line_bytes):
        lines.append('"\\x' + data[i:i + line_bytes].hex(" ").replace(" ", "\\x") + '"')
    return f"static const unsigned char {name}[] OSM_ALIGNED =\n" + ("\n".join(lines) or '""') + ";"


# -- compile ----------------------------------------------------------------------------------
_WORKER = ("import pickle, sys\n"
           "from opsmith._build._nvrtc import compile_request\n"
           "for r in pickle.load(sys.stdin.buffer):\n"
           "    try:\n"
           "        compile_request(r)\n"
           "    except Exception:\n"
           "        pass  # the parent compiles it again and reports the error\n")


def _compile_all(requests) -> list:
    """CudaBinary per request, from the store or NVRTC.

    The first request shows whether this export is cold: when NVRTC had to compile it, worker
    processes compile the others into the store (NVRTC calls in one process are serialised),
    and this process then reads them from there. The workers are plain ``python -c``
    processes, not multiprocessing's, which would run the caller's ``__main__`` again.
    """
    import pickle
    import sys
    from opsmith._build._nvrtc import compile_request
    from opsmith._toolchain._cxx import max_jobs
    first = compile_request(requests[0])
    rest = list(requests[1:])
    jobs = min(max_jobs(per_job_bytes=1 << 29), len(rest))
    if not first.from_cache and jobs > 1:
        procs = []
        for j in range(jobs):
            proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append((proc, pickle.dumps(rest[j::jobs])))
        for proc, data in procs:
            proc.communicate(data)
    return [first, *(compile_request(r) for r in rest)]


def build_c_library(source: str | os.PathLike, out_dir: str | os.PathLike, name: str, *,
                    static: bool = True, shared: bool = True, cc: str | None = None) -> dict[str, Path]:
    """Compile a generated ``.c`` into ``lib<name>.a`` and/or ``lib<name>.so`` with the system C compiler.

    ``cc``: the compiler (default: ``cc``, ``gcc`` or ``clang`` on PATH). The shared library
    exports only the API (``-fvisibility=hidden``) and needs no libcuda (``readelf -d``).
    """
    compiler = cc or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None or shutil.which(compiler) is None:
        raise ToolchainError(f"no C compiler {'named ' + repr(cc) if cc else '(cc, gcc or clang)'} on PATH to "
                             f"build the library: install gcc (apt-get install gcc), pass cc=, or build "
                             f"{source} yourself")
    out = Path(out_dir)
    obj = out / f"{name}.o"
    results: dict[str, Path] = {}
    _run([compiler, "-std=c99", "-O2", "-fPIC", "-fvisibility=hidden", "-c", os.fspath(source), "-o", str(obj)],
         source)
    try:
        if static:
            lib = out / f"lib{name}.a"
            lib.unlink(missing_ok=True)
            _run([shutil.which("ar") or "ar", "rcs", str(lib), str(obj)], source)
            results["static"] = lib
        if shared:
            lib = out / f"lib{name}.so"
            _run([compiler, "-shared", "-o", str(lib), str(obj), f"-Wl,-soname,lib{name}.so",
                  "-Wl,--as-needed", "-ldl", "-lpthread"], source)
            results["shared"] = lib
    finally:
        obj.unlink(missing_ok=True)
    return results


def _run(cmd: list[str], source) -> None:
    run_tool(cmd, source, "the exported library")


# -- the export -------------------------------------------------------------------------------
def export_c(sources: str | os.PathLike | Sequence[str | os.PathLike], kernels: Sequence[str] | None = None, *,
             out_dir: str | os.PathLike, prefix: str | None = None, archs: Iterable[str | int] | None = None,
             ptx: bool = True, library: str | None = None, cc: str | None = None,
             include_paths: Iterable[str | os.PathLike] = (),
             defines: Mapping[str, Any] | Iterable[str] | None = None,
             headers: Mapping[str, str] | None = None, options: Iterable[str] = (),
             std: str | None = "c++17") -> CExport:
    """Export CUDA kernels as a C library: a header, a source with the code embedded, a manifest.

    Parameters
    ----------
    sources : str, path-like or a list of them
        ``.cu`` files or CUDA C++ text.
    kernels : list of str, optional
        Kernel names or name expressions (``"scale<float>"``); ``"alias=scale<float>"`` names
        the C functions. Default: every kernel that is not a template.
    out_dir : path-like
        Where ``<prefix>.h``, ``<prefix>.c`` and ``<prefix>.json`` (and the libraries) go.
    prefix : str, optional
        The C prefix: functions are ``opsmith_<prefix>_<kernel>_launch``. Default: the first
        file's stem, else ``"kernels"``.
    archs : list of str, optional
        ``["sm_80", "sm_90"]``. Default: :func:`default_archs`.
    ptx : bool
        Also embed PTX of the newest arch, which the driver compiles for newer GPUs (default).
    library : {None, "static", "shared", "both"}
        Also build ``lib<prefix>.a`` and/or ``lib<prefix>.so`` with the system C compiler ``cc``.
    include_paths, defines, headers, options, std
        As for :func:`opsmith.compile_cuda`.

    Returns
    -------
    CExport

    Examples
    --------
    >>> e = opsmith.export_c("relu.cu", ["relu"], out_dir="out", archs=["sm_90"])  # doctest: +SKIP
    >>> e.kernels                                                                # doctest: +SKIP
    {'relu': 'opsmith_relu_relu_launch'}
    """
    from opsmith._build._export_c_template import HEADER, KERNEL_DECL, KERNEL_DEF, SOURCE
    from opsmith._build._nvrtc import make_request
    from opsmith._build._cubin import kernel_resources
    t0 = time.perf_counter()
    if library not in (None, "static", "shared", "both"):
        raise SpecError(f"library must be 'static', 'shared', 'both' or None, got {library!r}")
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not sources:
        raise SpecError("no source to export: pass a .cu file or CUDA C++ text")
    targets = _resolve_archs(archs, ptx)
    opts = dict(include_paths=include_paths, defines=defines, headers=headers, options=options, std=std)
    probes = [make_request(s, arch=targets[0][0], **opts) for s in sources]
    if prefix is None:
        first = sources[0]
        stem = Path(first).stem if probes[0].source_dir else "kernels"
        prefix = _c_name(stem) or "kernels"
    if not re.fullmatch(_IDENT, prefix):
        raise SpecError(f"prefix {prefix!r} is not a C identifier; use letters, digits and _ (e.g. 'mylib')")
    found = _find_kernels(probes, kernels)
    requests = []  # module-major: requests[m * len(targets) + a]
    for m, probe in enumerate(probes):
        exprs = [k.name for k in found if k.module == m and (not k.decl.extern_c or k.decl.template_params)]
        for arch, kind in targets:
            requests.append(probe._replace(arch=arch, output=kind,
                                           name_expressions=tuple(dict.fromkeys(exprs))))
    t1 = time.perf_counter()
    binaries = _compile_all(requests)
    t2 = time.perf_counter()

    ntargets = len(targets)
    lowered = [binaries[m * ntargets].lowered_names for m in range(len(probes))]
    sigs = [_signature(k, lowered[k.module]) for k in found]
    archs_named = [a if kind == "cubin" else a.replace("sm_", "compute_") for a, kind in targets]

    # the C text
    upper = f"OPSMITH_{prefix.upper()}"
    subst = dict(prefix=prefix, PREFIX=upper, version=__version__, guard=f"{upper}_H_",
                 num_kernels=len(found), num_modules=len(probes), num_archs=ntargets,
                 arch_list=", ".join(archs_named) + (" (PTX: compute_*)" if ptx else ""),
                 arch_names=", ".join(archs_named))
    decls, defs, kernel_list, kernel_table, manifest_kernels = [], [], [], [], []
    res_by_image = [kernel_resources(b.code) if b.kind == "cubin" else {} for b in binaries]
    for i, (k, sig) in enumerate(zip(found, sigs)):
        used: set[str] = set()
        cparams = [_c_param(p, used) for p in sig.params]
        names = [c.rsplit(" ", 1)[-1].lstrip("*") for c in cparams]
        params = "".join(", " + c for c in cparams)
        decls.append(KERNEL_DECL.substitute(subst, display=k.name.replace("*/", "* /"), symbol=sig.symbol,
                                            cname=k.cname, params=params))
        defs.append(KERNEL_DEF.substitute(
            subst, cname=k.cname, params=params, index=i,
            args_decl=f"    void *args[{len(names)}];\n" if names else "",
            args_fill="".join(f"    args[{j}] = (void *)&{n};\n" for j, n in enumerate(names)),
            args_ptr="args" if names else "NULL"))
        kernel_list.append(f" *   opsmith_{prefix}_{k.cname}_launch: {k.name}\n")
        kernel_table.append(f"    {{{json.dumps(k.name)}, {json.dumps(sig.symbol)}, {k.module}}},\n")
        resources = {}
        for a, (arch, kind) in enumerate(targets):
            if kind == "cubin":
                res = res_by_image[k.module * ntargets + a].get(sig.symbol)
                if res is not None:
                    resources[arch] = res
        manifest_kernels.append({
            "name": k.name, "c_name": k.cname, "symbol": sig.symbol, "module": k.module,
            "launch": f"opsmith_{prefix}_{k.cname}_launch", "attributes": f"opsmith_{prefix}_{k.cname}_attributes",
            "c_params": ", ".join(cparams), "signature": sig.to_json(), "resources": resources})
    image_texts, arch_table = [], []
    for a, ((arch, kind), named) in enumerate(zip(targets, archs_named)):
        major, minor = divmod(_arch_number(arch), 10)
        imgs = []
        for m in range(len(probes)):
            name = f"osm_image_{a}_{m}"
            image_texts.append(embed_literal(name, binaries[m * ntargets + a].code))
            imgs.append(name)
        arch_table.append(f'    {{"{named}", {major}, {minor}, {int(kind == "ptx")}, '
                          f'{int(arch.endswith(("a", "f")))}, {{{", ".join(imgs)}}}}},\n')
    header = HEADER.substitute(subst, kernel_list="".join(kernel_list), kernel_decls="".join(decls))
    source = SOURCE.substitute(subst, images="\n".join(image_texts), arch_table="".join(arch_table),
                               kernel_table="".join(kernel_table), kernel_defs="".join(defs))
    t3 = time.perf_counter()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"header": out / f"{prefix}.h", "source": out / f"{prefix}.c", "manifest": out / f"{prefix}.json"}
    manifest = {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "opsmith": __version__, "prefix": prefix,
        "nvrtc": binaries[0].nvrtc_version, "header": paths["header"].name, "source": paths["source"].name,
        "archs": [{"arch": named, "kind": kind} for named, (_a, kind) in zip(archs_named, targets)],
        "modules": [{"name": p.name, "images": [
            {"arch": archs_named[a], "kind": kind, "bytes": len(binaries[m * ntargets + a].code),
             "cache_key": binaries[m * ntargets + a].key} for a, (_arch, kind) in enumerate(targets)]}
            for m, p in enumerate(probes)],
        "kernels": manifest_kernels,
    }
    _write(paths["header"], header)
    _write(paths["source"], source)
    _write(paths["manifest"], json.dumps(manifest, indent=1) + "\n")
    t4 = time.perf_counter()
    libs: dict[str, Path] = {}
    if library is not None:
        libs = build_c_library(paths["source"], out, prefix, static=library in ("static", "both"),
                               shared=library in ("shared", "both"), cc=cc)
    t5 = time.perf_counter()
    seconds = {"parse": t1 - t0, "compile": t2 - t1, "generate": t3 - t2, "write": t4 - t3, "library": t5 - t4,
               "total": t5 - t0}
    log.info("exported %d kernels for %s in %.2f s", len(found), ", ".join(archs_named), seconds["total"])
    return CExport(header=paths["header"], source=paths["source"], manifest=paths["manifest"],
                   static_library=libs.get("static"), shared_library=libs.get("shared"),
                   kernels={k.name: f"opsmith_{prefix}_{k.cname}_launch" for k in found},
                   archs=tuple(archs_named), seconds=seconds)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
