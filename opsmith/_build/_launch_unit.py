"""A launch unit: CUDA kernels compiled for several archs, embedded in the launch core's C.

Data flow::

    sources + kernel names -> declarations (parse_kernels) -> the kernels to launch
    archs (default: the common ones NVRTC supports, + PTX of the newest)
        -> one NVRTC compile per (source, arch), cached (opsmith._build._archs_compile)
    -> a KernelSignature per kernel (the lowered names NVRTC gave)
    -> <prefix>.h / <prefix>.c: opsmith._runtime._launch_gen fills the launch core

export-c writes the unit out with its header comment and manifest; the ONNX Runtime library
builds the units of its CUDA modules into itself.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opsmith._errors import SpecError
from opsmith._record import Record
from opsmith._runtime._launch_gen import LaunchKernel, generate

__all__ = ["LaunchUnit", "build_launch_unit", "c_name"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


class LaunchUnit(Record):
    """What :func:`build_launch_unit` made: ``prefix``; ``kernels`` (a
    :class:`~opsmith._runtime._launch_gen.LaunchKernel` each); ``targets``, the ``(arch, kind)``
    pairs; ``modules``, each source's name; ``binaries[m][a]``, module ``m``'s
    :class:`~opsmith.CudaBinary` for ``targets[a]``; ``code``, the filled launch core
    (:class:`~opsmith._runtime._launch_gen.LaunchSource`); ``seconds`` per step (parse, compile,
    generate)."""

    __slots__ = ("prefix", "kernels", "targets", "modules", "binaries", "code", "seconds")


class _Found(Record):
    __slots__ = ("name", "cname", "module", "decl")


def c_name(name: str) -> str:
    """A C identifier for a kernel name or file stem: ``scale<float, 4>`` -> ``scale_float_4``."""
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", name)).strip("_")


def _names(requests) -> str:
    return ", ".join(r.name for r in requests)


def _find_kernels(requests, kernels: Sequence[str] | None) -> list[_Found]:
    from opsmith._runtime._signature import parse_kernels, split_name_expression
    decls = [parse_kernels(r.source) for r in requests]
    if kernels is None:
        out = [_Found(d.name, c_name(d.name), m, d) for m, ds in enumerate(decls) for d in ds.values()
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
        base, targs = split_name_expression(expr)
        where = [m for m, ds in enumerate(decls) if base in ds]
        if not where:
            found = sorted({d for ds in decls for d in ds})
            raise SpecError(f"no kernel {base!r} in {_names(requests)}; the __global__ functions there are "
                            f"{', '.join(found) or 'none'}")
        if len(where) > 1:
            raise SpecError(f"kernel {base!r} is declared in {_names([requests[m] for m in where])}: "
                            f"export those sources separately (two libraries with different prefixes)")
        decl = decls[where[0]][base]
        if decl.template_params and len(targs) != len(decl.template_params):
            example = f"{base}<{', '.join('float' for _ in decl.template_params)}>"
            raise SpecError(f"kernel {base!r} is a template <{', '.join(decl.template_params)}>: name an "
                            f"instantiation, e.g. '{example}' (--kernel '{example}')")
        cname = alias.strip() or c_name(expr)
        if not re.fullmatch(_IDENT, cname):
            raise SpecError(f"{alias.strip()!r} is not a C identifier; name the kernel like 'scale_f=scale<float>'")
        out.append(_Found(expr, cname, where[0], decl))
    seen: dict[str, str] = {}
    for k in out:
        if k.cname in seen:
            raise SpecError(f"kernels {seen[k.cname]!r} and {k.name!r} would both be called {k.cname!r} in C; "
                            f"name one of them: '{k.cname}_2={k.name}'")
        seen[k.cname] = k.name
    return out


def _signature(kernel: _Found, lowered: Mapping[str, str]):
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


def build_launch_unit(sources: str | os.PathLike | Sequence[str | os.PathLike], kernels: Sequence[str] | None = None,
                      *, prefix: str | None = None, archs: Iterable[str | int] | None = None, ptx: bool = True,
                      header_name: str | None = None, tool: str = "opsmith",
                      include_paths: Iterable[str | os.PathLike] = (),
                      defines: Mapping[str, Any] | Iterable[str] | None = None,
                      headers: Mapping[str, str] | None = None, options: Iterable[str] = (),
                      std: str | None = "c++17") -> LaunchUnit:
    """Compile ``kernels`` of ``sources`` for ``archs`` (cached) and fill the launch core with them.

    ``kernels``: names or name expressions (``"scale<float>"``; ``"alias=scale<float>"`` names
    the C functions); default every kernel that is not a template. ``prefix``: the C prefix
    (default: the first file's stem, else ``"kernels"``). ``archs``, ``ptx``: see
    :func:`~opsmith._build._archs_compile.resolve_archs`. ``header_name``, ``tool``: see
    :func:`~opsmith._runtime._launch_gen.generate`. The rest is as for :func:`opsmith.compile_cuda`.
    """
    from opsmith._build._archs_compile import compile_all, resolve_archs
    from opsmith._build._nvrtc import make_request
    t0 = time.perf_counter()
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not sources:
        raise SpecError("no source to export: pass a .cu file or CUDA C++ text")
    targets = resolve_archs(archs, ptx)
    opts = dict(include_paths=include_paths, defines=defines, headers=headers, options=options, std=std)
    probes = [make_request(s, arch=targets[0][0], **opts) for s in sources]
    if prefix is None:
        stem = Path(sources[0]).stem if probes[0].source_dir else "kernels"
        prefix = c_name(stem) or "kernels"
    if not re.fullmatch(_IDENT, prefix):
        raise SpecError(f"prefix {prefix!r} is not a C identifier; use letters, digits and _ (e.g. 'mylib')")
    found = _find_kernels(probes, kernels)
    requests = []  # module-major: requests[m * len(targets) + a]
    for m, probe in enumerate(probes):
        exprs = [k.name for k in found if k.module == m and (not k.decl.extern_c or k.decl.template_params)]
        for arch, kind in targets:
            requests.append(probe._replace(arch=arch, output=kind, name_expressions=tuple(dict.fromkeys(exprs))))
    t1 = time.perf_counter()
    flat = compile_all(requests)
    t2 = time.perf_counter()
    n = len(targets)
    binaries = [flat[m * n:(m + 1) * n] for m in range(len(probes))]
    launch = [LaunchKernel(k.name, k.cname, k.module, _signature(k, binaries[k.module][0].lowered_names))
              for k in found]
    code = generate(prefix, launch, targets, [[binaries[m][a].code for m in range(len(probes))] for a in range(n)],
                    header_name=header_name, tool=tool)
    t3 = time.perf_counter()
    return LaunchUnit(prefix=prefix, kernels=launch, targets=targets, modules=[p.name for p in probes],
                      binaries=binaries, code=code, seconds={"parse": t1 - t0, "compile": t2 - t1, "generate": t3 - t2})
