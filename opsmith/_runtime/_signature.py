"""Kernel signatures: read ``__global__`` declarations out of CUDA C++ source, no compiler needed.

A signature is a list of :class:`Param`, one per kernel parameter, that says what a launch
must receive in that position (a CUDA tensor of some dtypes, or a Python number that fits a
C type) and how to pack it (a ctypes type). Templates are resolved by a name expression:
``scale<float>`` substitutes ``float`` for the template parameter in the declaration.
When the source is too clever for this reader (macros that make the declaration), declare
the signature yourself: ``module.get_kernel("k", signature="const float* x, int n")``.
"""
from __future__ import annotations

import ctypes
import re

from opsmith._errors import SpecError
from opsmith._record import Record

__all__ = ["Param", "KernelSignature", "KernelDecl", "parse_kernels", "parse_params", "split_name_expression", "elem_size",
           "resolve_signature"]

# C type (after qualifiers are removed) -> (torch dtype name, ctypes type, kind)
_SCALARS: dict[str, tuple[str, type, str]] = {}
for _names, _dt, _ct, _kind in [
    (("float",), "float32", ctypes.c_float, "float"),
    (("double",), "float64", ctypes.c_double, "float"),
    (("int", "signed", "signed int", "int32_t"), "int32", ctypes.c_int32, "int"),
    (("unsigned", "unsigned int", "uint32_t"), "uint32", ctypes.c_uint32, "int"),
    (("long long", "long long int", "signed long long", "int64_t", "long", "long int", "ptrdiff_t",
      "intptr_t", "ssize_t", "signed long"), "int64", ctypes.c_int64, "int"),
    (("unsigned long long", "unsigned long long int", "unsigned long", "uint64_t", "size_t",
      "uintptr_t"), "uint64", ctypes.c_uint64, "int"),
    (("short", "short int", "int16_t", "signed short"), "int16", ctypes.c_int16, "int"),
    (("unsigned short", "uint16_t"), "uint16", ctypes.c_uint16, "int"),
    (("char", "signed char", "int8_t"), "int8", ctypes.c_int8, "int"),
    (("unsigned char", "uint8_t"), "uint8", ctypes.c_uint8, "int"),
    (("bool",), "bool", ctypes.c_bool, "bool"),
]:
    for _n in _names:
        _SCALARS[_n] = (_dt, _ct, _kind)

# pointee type -> (accepted torch dtype names, required byte alignment of the address)
_POINTEES: dict[str, tuple[tuple[str, ...], int]] = {
    n: ((dt,), ctypes.sizeof(ct)) for n, (dt, ct, _) in _SCALARS.items()}
_POINTEES.update({
    "char": (("int8", "uint8"), 1), "signed char": (("int8",), 1),
    "__half": (("float16",), 2), "half": (("float16",), 2),
    "__nv_bfloat16": (("bfloat16",), 2), "nv_bfloat16": (("bfloat16",), 2),
    "__half2": (("float16",), 4), "half2": (("float16",), 4),
    "__nv_bfloat162": (("bfloat16",), 4), "nv_bfloat162": (("bfloat16",), 4),
    "float2": (("float32",), 8), "float4": (("float32",), 16),
    "double2": (("float64",), 16), "int2": (("int32",), 8), "int4": (("int32",), 16),
    "uint2": (("uint32",), 8), "uint4": (("uint32",), 16), "char4": (("int8",), 4),
    "uchar4": (("uint8",), 4), "longlong2": (("int64",), 16),
    "void": ((), 1),  # any dtype
})
_INT_RANGE = {"int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-2**63, 2**63 - 1),
              "uint64": (0, 2**64 - 1), "int16": (-2**15, 2**15 - 1), "uint16": (0, 2**16 - 1),
              "int8": (-128, 127), "uint8": (0, 255), "bool": (0, 1)}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__",
               "struct", "class", "typename", "register"}
_TYPE_WORDS = {"int", "float", "double", "char", "short", "long", "unsigned", "signed", "bool", "void"}


class Param(Record):
    """One kernel parameter: what a launch must pass there and how it is packed.

    ``kind`` is ``"tensor"`` (a pointer: pass a CUDA tensor), ``"int"``, ``"float"`` or
    ``"bool"`` (pass a Python number). ``dtypes`` lists the tensor dtypes accepted (empty:
    any, for ``void*`` and unknown structs); ``align`` is the address alignment required.
    """

    __slots__ = ("index", "name", "ctype", "kind", "dtypes", "align", "ctypes_type", "range")
    _defaults = {"dtypes": (), "align": 1, "ctypes_type": ctypes.c_uint64, "range": None}

    def describe(self) -> str:
        return f"argument {self.index} {self.name!r} ({self.ctype})"

    def expects(self) -> str:
        if self.kind == "tensor":
            dts = " or ".join(f"torch.{d}" for d in self.dtypes) or "any-dtype"
            extra = f", data pointer aligned to {self.align} bytes" if self.align > 1 and \
                self.dtypes and self.align > elem_size(self.dtypes[0]) else ""
            return f"a contiguous {dts} CUDA tensor{extra}"
        if self.kind == "float":
            return "a Python float (or int)"
        if self.kind == "bool":
            return "a Python bool"
        lo, hi = self.range or (None, None)
        return f"a Python int in [{lo}, {hi}]"


def elem_size(dtype: str) -> int:
    """Bytes per element of a torch dtype name."""
    return {"float64": 8, "int64": 8, "uint64": 8, "float32": 4, "int32": 4, "uint32": 4,
            "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2}.get(dtype, 1)


class KernelDecl(Record):
    """A ``__global__`` function found in the source: name, params_text, template_params
    (names, in order), extern_c, line."""

    __slots__ = ("name", "params_text", "template_params", "extern_c", "line")


def _strip_comments(src: str) -> str:
    # keep newlines so that line numbers survive
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


# Pattern texts, compiled by `re` on first use (its cache): a warm load that finds the parse
# in the store compiles none of them.
_ATTR_CALLS = (r"\b(__launch_bounds__|__maxnreg__|__cluster_dims__|__align__|"
               r"__attribute__)\s*\(")
_GLOBAL = r"\b__global__\b"


def _remove_calls(text: str) -> str:
    """Remove ``__launch_bounds__(...)`` and friends (balanced parentheses)."""
    out, pos = [], 0
    for m in re.finditer(_ATTR_CALLS, text):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append(text[pos:m.start()])
        out.append(" " * (i - m.start() - text[m.start():i].count("\n")) + "\n" * text[m.start():i].count("\n"))
        pos = i
    out.append(text[pos:])
    return "".join(out)


def parse_kernels(source: str) -> dict[str, KernelDecl]:
    """Every ``__global__`` function declared in ``source``, by name (the first one wins).

    Examples
    --------
    >>> d = parse_kernels('template <typename T> __global__ void scale(T* x, T a, int n) {}')
    >>> d["scale"].template_params, d["scale"].params_text
    (('T',), 'T* x, T a, int n')
    """
    text = _remove_calls(_strip_comments(source))
    found: dict[str, KernelDecl] = {}
    for m in re.finditer(_GLOBAL, text):
        # the declaration: from __global__ to the parameter list's opening parenthesis
        # the declaration's last `name(...)` before its body or `;`: earlier ones are attribute
        # macros (`__global__ void MY_BOUNDS(256) kernel(...)`)
        pos, decl = m.end(), None
        while (head := re.match(r"[^;{}()]*?\b([A-Za-z_]\w*)\s*\(", text[pos:])) is not None:
            start = pos + head.end()
            depth, i = 1, start
            while i < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            decl = (head.group(1), start, i)
            if re.match(r"\s*[A-Za-z_]\w*\s*\(", text[i:]) is None:
                break
            pos = i
        if decl is None:
            continue
        name, start, i = decl
        params = " ".join(text[start:i - 1].split())
        before = text[:m.start()]
        stmt_start = max(before.rfind(";"), before.rfind("}"), before.rfind("{")) + 1
        prefix = before[stmt_start:]
        tparams: tuple[str, ...] = ()
        tm = re.search(r"\btemplate\s*<(.*)>", prefix, flags=re.S)
        if tm:
            tparams = tuple(_template_param_name(p) for p in _split_top(tm.group(1)) if p.strip())
        extern_c = bool(re.search(r'extern\s+"C"', prefix)) or _in_extern_c_block(before)
        if name not in found:
            found[name] = KernelDecl(name, params, tparams, extern_c, text.count("\n", 0, m.start()) + 1)
    return found


def _in_extern_c_block(before: str) -> bool:
    """Whether the text before a declaration leaves us inside ``extern "C" { ... }``."""
    for m in reversed(list(re.finditer(r'extern\s+"C"\s*\{', before))):
        depth = 0
        for ch in before[m.end():]:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth < 0:
                break
        return depth >= 0
    return False


def _template_param_name(p: str) -> str:
    p = p.split("=")[0].strip()
    return re.findall(r"[A-Za-z_]\w*", p)[-1]


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside <>, () or []."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def split_name_expression(expr: str) -> tuple[str, list[str]]:
    """``"scale<float, 4>"`` -> ``("scale", ["float", "4"])``; a plain name has no arguments."""
    expr = expr.strip()
    if "<" not in expr:
        return expr.lstrip("&:").split("::")[-1], []
    base, _, rest = expr.partition("<")
    if not rest.endswith(">"):
        raise SpecError(f"cannot read the name expression {expr!r}; write it like 'scale<float>'")
    return base.strip().lstrip("&").split("::")[-1], _split_top(rest[:-1])


def parse_params(text: str) -> list[Param]:
    """Parse a parameter list such as ``"const float* __restrict__ x, long long n"``.

    Examples
    --------
    >>> [(p.name, p.kind, p.dtypes) for p in parse_params("const float* x, int n")]
    [('x', 'tensor', ('float32',)), ('n', 'int', ())]
    """
    text = text.strip()
    if text in ("", "void"):
        return []
    params = []
    for i, raw in enumerate(_split_top(text)):
        params.append(_parse_param(i, raw))
    return params


def _parse_param(index: int, raw: str) -> Param:
    decl = raw.split("=")[0].strip()
    array = decl.endswith("]")
    decl = re.sub(r"\[[^\]]*\]\s*$", "", decl)
    stars = decl.count("*") + (1 if array else 0)
    if "&" in decl:
        raise SpecError(f"parameter {index} ({raw.strip()}) is a reference, which a kernel cannot take")
    words = re.findall(r"[A-Za-z_][\w:]*", decl.replace("*", " "))
    words = [w for w in words if w not in _QUALIFIERS]
    name = f"arg{index}"
    if len(words) > 1 and words[-1] not in _TYPE_WORDS:
        name = words.pop()
    base = " ".join(w.split("::")[-1] for w in words)
    ctype = (" ".join(raw.split()))
    if stars == 0:
        info = _SCALARS.get(base)
        if info is None:
            return Param(index, name, ctype, "unsupported")
        dt, ct, kind = info
        return Param(index, name, ctype, kind, (), 1, ct, _INT_RANGE.get(dt) if kind != "float" else None)
    if stars > 1:
        return Param(index, name, ctype, "unsupported")
    dtypes, align = _POINTEES.get(base, ((), 1))
    return Param(index, name, ctype, "tensor", dtypes, align, ctypes.c_uint64)


def resolve_signature(decl: KernelDecl, template_args: list[str]) -> list[Param]:
    """The parameters of ``decl`` with its template parameters replaced by ``template_args``."""
    text = decl.params_text
    if decl.template_params:
        if len(template_args) != len(decl.template_params):
            raise SpecError(
                f"kernel {decl.name!r} is a template <{', '.join(decl.template_params)}>; name an "
                f"instantiation such as '{decl.name}<{', '.join('float' for _ in decl.template_params)}>' "
                f"and list it in name_expressions=.")
        for tp, arg in zip(decl.template_params, template_args):
            text = re.sub(rf"\b{re.escape(tp)}\b", arg, text)
    return parse_params(text)


_CTYPES_BY_DTYPE = {dt: ct for dt, ct, _ in _SCALARS.values()}


class KernelSignature(Record):
    """One kernel's signature, parsed once: the single description every consumer reads.

    ``name`` is the name or name expression the kernel is taken by (``"scale<float>"``),
    ``symbol`` the symbol in the binary (the lowered name for C++ kernels) and ``params``
    its :class:`Param` list. The Python launcher's checks, the C launcher's description,
    and (through :meth:`to_json`) cache entries, torch schemas, fake kernels, ONNX Runtime
    definitions and exported C headers are all generated from it.

    Examples
    --------
    >>> s = KernelSignature.parse("relu", "const float* x, float* y, long long n")
    >>> [p.kind for p in s.params], s.c_params()
    (['tensor', 'tensor', 'int'], 'const float* x, float* y, long long n')
    >>> KernelSignature.from_json(s.to_json()) == s
    True
    """

    __slots__ = ("name", "symbol", "params")
    VERSION = 1

    @classmethod
    def parse(cls, name: str, params_text: str, symbol: str | None = None) -> "KernelSignature":
        """From a parameter list such as ``"const float* x, int n"`` (in parentheses or not)."""
        text = params_text.strip()
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
        return cls(name, symbol or name, tuple(parse_params(text)))

    @classmethod
    def from_decl(cls, name: str, decl: KernelDecl, symbol: str) -> "KernelSignature":
        """From a parsed declaration, its template parameters bound by the name expression."""
        return cls(name, symbol, tuple(resolve_signature(decl, split_name_expression(name)[1])))

    def c_params(self) -> str:
        """The parameter list as C (the declared types, template arguments substituted)."""
        return ", ".join(f"{p.ctype}" if p.ctype.endswith(p.name) else f"{p.ctype} {p.name}"
                         for p in self.params)

    def unsupported(self) -> list[Param]:
        """The parameters no launcher can pass (references to structs, pointers to pointers)."""
        return [p for p in self.params if p.kind == "unsupported"]

    def to_json(self) -> dict:
        """A JSON-able description, versioned (``from_json`` refuses other versions)."""
        return {"version": self.VERSION, "name": self.name, "symbol": self.symbol,
                "params": [{"name": p.name, "ctype": p.ctype, "kind": p.kind, "dtypes": list(p.dtypes),
                            "align": p.align, "range": list(p.range) if p.range else None}
                           for p in self.params]}

    @classmethod
    def from_json(cls, data: dict) -> "KernelSignature":
        if not isinstance(data, dict) or data.get("version") != cls.VERSION:
            raise SpecError(f"kernel signature of version {data.get('version') if isinstance(data, dict) else '?'}"
                            f", this opsmith reads version {cls.VERSION}")
        params = []
        for i, d in enumerate(data["params"]):
            kind, dtypes = d["kind"], tuple(d["dtypes"])
            if kind == "tensor" or kind == "unsupported":
                ct = ctypes.c_uint64
            else:
                ct = _scalar_ctype(d["ctype"])
            params.append(Param(i, d["name"], d["ctype"], kind, dtypes, int(d["align"]), ct,
                                tuple(d["range"]) if d["range"] else None))
        return cls(data["name"], data["symbol"], tuple(params))


def _scalar_ctype(ctype: str) -> type:
    p = _parse_param(0, ctype)
    return p.ctypes_type
