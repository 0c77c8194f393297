"""The launch core's C, generated from kernel signatures: ``launch/osm_launch.h`` and ``.c`` filled in.

The launch core is C in real files (package data of ``opsmith._runtime``, read through
:mod:`importlib.resources`): ``osm_launch.h`` declares the driver types and one library's API;
``osm_driver.h`` opens the driver once (``dlopen("libcuda.so.1")`` + ``cuGetProcAddress``) and
keeps the error texts and this thread's last error; ``osm_launch.c`` keeps per-device state,
picks the image for the device's compute capability, loads modules with the shared-memory
opt-in, finds a kernel's function by the current context and launches it. :func:`generate`
fills them for one library: the image table (every per-arch image embedded), the kernel table
and, per kernel, the typed launch and attributes functions; the source it returns has
``osm_driver.h`` written in place of its ``#include``, so that it needs no other file.

Placeholders are ``@NAME@``, filled in one pass (a value is never filled again); the lines
between ``/* @BEGIN_KERNEL@ */`` and ``/* @END_KERNEL@ */`` are repeated once per kernel. Every
internal name is ``static`` and every public one carries the prefix (``opsmith_<prefix>_*``),
so several generated libraries link into one program. Generating C text is not compiling:
the images come in as bytes; the build (``opsmith._build._launch_unit``) makes them.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources

from opsmith._errors import SpecError
from opsmith._record import Record
from opsmith._version import __version__

__all__ = ["LaunchKernel", "LaunchSource", "generate", "c_param", "C_TYPES", "embed_literal", "fill",
           "fill_sections", "inline_include", "template_text", "arch_number", "image_name", "TEMPLATES"]

#: The launch core's template files (``opsmith/_runtime/launch/``).
TEMPLATES = ("osm_launch.h", "osm_driver.h", "osm_launch.c")
_PLACEHOLDER = r"@[A-Z_]+@"
_SECTION = r"^/\* @BEGIN_{0}@ \*/\n(.*?)^/\* @END_{0}@ \*/\n"
_RESERVED = {"stream", "grid", "block", "shared_mem", "f", "r", "args"}  # names the launch functions use
# scalar spellings that are valid C (with stdint.h/stddef.h/stdbool.h); others map by dtype
_C_SCALARS = {"float", "double", "int", "signed", "signed int", "unsigned", "unsigned int", "long",
              "long int", "signed long", "unsigned long", "long long", "long long int", "signed long long",
              "unsigned long long", "unsigned long long int", "short", "short int", "signed short",
              "unsigned short", "char", "signed char", "unsigned char", "bool", "size_t", "ptrdiff_t",
              "intptr_t", "uintptr_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
              "uint32_t", "uint64_t"}
#: The C type of each scalar dtype (``"float32"`` -> ``"float"``).
C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "uint32": "uint32_t",
           "int64": "int64_t", "uint64": "uint64_t", "int16": "int16_t", "uint16": "uint16_t",
           "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}


class LaunchKernel(Record):
    """One kernel of a library: ``name`` (as taken, ``"scale<float>"``), ``cname`` (its C name,
    ``"scale_f"``), ``module`` (the index of the image that holds it) and ``signature``
    (its :class:`~opsmith._runtime._signature.KernelSignature`)."""

    __slots__ = ("name", "cname", "module", "signature")


class LaunchSource(Record):
    """The filled launch core: ``header`` and ``source`` (C text), and per kernel name its
    ``launchers`` and ``attributes`` functions and ``c_params`` (the C parameter list);
    ``last_error`` is the function that says why a call failed on this thread."""

    __slots__ = ("header", "source", "launchers", "attributes", "c_params", "last_error")


def template_text(name: str) -> str:
    """The text of the launch core's template ``name`` (one of :data:`TEMPLATES`), from the installed package."""
    if name not in TEMPLATES:
        raise SpecError(f"no launch-core template {name!r}; the templates are {', '.join(TEMPLATES)}")
    return resources.files("opsmith._runtime").joinpath("launch", name).read_text(encoding="utf-8")


def fill(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``@NAME@`` replaced by ``values["NAME"]``, in one pass (a placeholder
    inside a value stays as it is); an unknown placeholder is an error naming it."""
    def one(m: re.Match) -> str:
        key = m.group(0)[1:-1]
        if key not in values:
            raise SpecError(f"template placeholder {m.group(0)} has no value (known: {', '.join(sorted(values))})")
        return values[key]
    return re.sub(_PLACEHOLDER, one, text)


def fill_sections(text: str, section: str, values: Mapping[str, str], items: Sequence[Mapping[str, str]]) -> str:
    """:func:`fill`, with the lines between ``/* @BEGIN_<section>@ */`` and ``/* @END_<section>@ */``
    repeated once per item (filled with ``values`` and the item's own)."""
    m = re.search(_SECTION.format(section), text, re.S | re.M)
    if m is None:
        raise SpecError(f"the template has no /* @BEGIN_{section}@ */ ... /* @END_{section}@ */ section")
    block = m.group(1)
    return (fill(text[:m.start()], values) + "".join(fill(block, {**values, **item}) for item in items)
            + fill(text[m.end():], values))


def inline_include(text: str, name: str, content: str) -> str:
    """``text`` with its one line ``#include "<name>"`` replaced by ``content`` (a file that needs no other)."""
    line = f'#include "{name}"\n'
    if text.count(line) != 1:
        raise SpecError(f'the template must include "{name}" exactly once to have it written in its place')
    return text.replace(line, content, 1)


def arch_number(arch: str) -> int:
    """``"sm_90a"`` -> 90, ``"compute_120"`` -> 120."""
    return int(re.sub(r"\D", "", arch))


def image_name(arch: str, kind: str) -> str:
    """What an image is called in tables and manifests: ``"sm_90"``, or ``"compute_90"`` for PTX."""
    return arch.replace("sm_", "compute_") if kind == "ptx" else arch


def c_param(p, used: set[str]) -> str:
    """One :class:`~opsmith._runtime._signature.Param` as a C parameter: qualifiers C does not
    know removed, unknown pointees as ``void``, names the launch functions use renamed
    (``stream`` -> ``stream_``); ``used`` collects the names of one parameter list."""
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
    ctype = base if base in _C_SCALARS else C_TYPES[_dtype_of(p)]
    return f"{ctype} {name}"


def _dtype_of(p) -> str:
    from opsmith._runtime._signature import _SCALARS
    for dt, ct, _kind in _SCALARS.values():
        if ct is p.ctypes_type:
            return dt
    return "int64"


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


def generate(prefix: str, kernels: Sequence[LaunchKernel], archs: Sequence[tuple[str, str]],
             images: Sequence[Sequence[bytes]], *, header_name: str | None = None,
             tool: str = "opsmith") -> LaunchSource:
    """The launch core filled for one library.

    ``archs`` lists ``(arch, kind)`` pairs (``("sm_90", "cubin")``, ``("sm_90", "ptx")``);
    ``images[a][m]`` is module ``m``'s code for ``archs[a]``. ``header_name`` is the file the
    source includes (default ``<prefix>.h``); ``tool`` is named in the source's first line.

    Examples
    --------
    >>> from opsmith._runtime._signature import KernelSignature
    >>> sig = KernelSignature.parse("relu", "const float* x, float* y, long long n")
    >>> src = generate("demo", [LaunchKernel("relu", "relu", 0, sig)], [("sm_90", "cubin")], [[b"\\0"]])
    >>> src.launchers, src.c_params["relu"]
    ({'relu': 'opsmith_demo_relu_launch'}, ['const float *x', 'float *y', 'long long n'])
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix):
        raise SpecError(f"prefix {prefix!r} is not a C identifier; use letters, digits and _ (e.g. 'mylib')")
    if not kernels:
        raise SpecError(f"library {prefix!r} has no kernel: a launch library needs at least one")
    nmodules = 1 + max(k.module for k in kernels)
    if len(images) != len(archs) or any(len(per_arch) != nmodules for per_arch in images):
        raise SpecError(f"library {prefix!r}: images must hold one image per module ({nmodules}) for each "
                        f"of the {len(archs)} archs")
    upper = f"OPSMITH_{prefix.upper()}"
    names = [image_name(a, kind) for a, kind in archs]
    values = {"PREFIX": prefix, "UPPER": upper, "GUARD": f"{upper}_H_", "VERSION": __version__, "TOOL": tool,
              "HEADER": header_name or f"{prefix}.h", "NUM_KERNELS": str(len(kernels)),
              "NUM_MODULES": str(nmodules), "NUM_ARCHS": str(len(archs)), "ARCH_NAMES": ", ".join(names)}
    per_kernel, kernel_table, c_params = [], [], {}
    for i, k in enumerate(kernels):
        used: set[str] = set()
        params = [c_param(p, used) for p in k.signature.params]
        args = [c.rsplit(" ", 1)[-1].lstrip("*") for c in params]
        c_params[k.name] = params
        per_kernel.append({"CNAME": k.cname, "INDEX": str(i), "DISPLAY": k.name.replace("*/", "* /"),
                           "SYMBOL": k.signature.symbol, "PARAMS": "".join(", " + c for c in params),
                           "ARGS": ", ".join(f"(void *)&{a}" for a in args) or "NULL",
                           "NUM_ARGS": str(len(args))})
        kernel_table.append(f"    {{{json.dumps(k.name)}, {json.dumps(k.signature.symbol)}, {k.module}}},\n")
    image_texts, arch_table = [], []
    for a, ((arch, kind), named) in enumerate(zip(archs, names)):
        major, minor = divmod(arch_number(arch), 10)
        refs = []
        for m in range(nmodules):
            refs.append(f"osm_image_{a}_{m}")
            image_texts.append(embed_literal(refs[-1], images[a][m]))
        arch_table.append(f'    {{"{named}", {major}, {minor}, {int(kind == "ptx")}, '
                          f'{int(arch.endswith(("a", "f")))}, {{{", ".join(refs)}}}}},\n')
    source_values = {**values, "IMAGES": "\n".join(image_texts), "ARCH_TABLE": "".join(arch_table),
                     "KERNEL_TABLE": "".join(kernel_table)}
    source = fill_sections(template_text("osm_launch.c"), "KERNEL", source_values, per_kernel)
    return LaunchSource(
        header=fill_sections(template_text("osm_launch.h"), "KERNEL", values, per_kernel),
        source=inline_include(source, "osm_driver.h", fill(template_text("osm_driver.h"), values)),
        launchers={k.name: f"opsmith_{prefix}_{k.cname}_launch" for k in kernels},
        attributes={k.name: f"opsmith_{prefix}_{k.cname}_attributes" for k in kernels},
        c_params=c_params, last_error=f"opsmith_{prefix}_last_error")
