"""Op schemas: given as text, or derived from a Python signature, an extension function's
docstring or an opsmith kernel's signature; parsed into the argument list the op generator reads.

A kernel's signature derives a schema by the C declaration: ``const T*`` parameters are
tensor inputs, other pointers are outputs (returned by the op, allocated from its output
spec), a trailing integer named like a count (``n``, ``numel``, ``size``, ...) is the number
of items the launch covers, and the other numbers are scalar arguments::

    relu(const float* x, float* y, long long n)   ->   (Tensor x) -> Tensor
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from opsmith._errors import SpecError
from opsmith._record import Record

__all__ = ["OpSchema", "COUNT_NAMES", "bind_kernel", "schema_from_kernel", "schema_from_function", "parse_schema"]

COUNT_NAMES = frozenset({"n", "N", "numel", "size", "count", "num", "length", "len", "num_items", "total"})
_KIND_TO_SCHEMA = {"int": "int", "float": "float", "bool": "bool"}
_PYBIND_TYPES = {"torch.Tensor": "Tensor", "at::Tensor": "Tensor", "Tensor": "Tensor", "float": "float",
                 "int": "int", "bool": "bool", "str": "str", "typing.SupportsInt": "int",
                 "typing.SupportsFloat": "float", "SupportsInt": "int", "SupportsFloat": "float"}
_NUMBER = {"int", "float", "bool", "SymInt", "SymFloat", "Scalar"}


class OpSchema(Record):
    """An op's parsed schema: ``text`` (``"(Tensor x) -> Tensor"``), ``arg_names``,
    ``arg_types`` (``"Tensor"``, ``"int"``, ...), ``kwarg_only`` (names), ``returns`` (the
    number of outputs), ``return_names`` (``out`` / ``out0``... where unnamed) and
    ``single`` (whether the op returns one tensor, not a tuple)."""

    __slots__ = ("text", "arg_names", "arg_types", "kwarg_only", "returns", "return_names", "single",
                 "tensor_returns")


def parse_schema(qualname: str, text: str) -> OpSchema:
    """Parse ``text`` (with or without the op's name in front) for the op ``qualname``."""
    import torch
    text = " ".join(str(text).split())
    if not text.startswith("("):
        # "name(Tensor x) -> Tensor" or "ns::name(...)": keep what follows the name
        m = re.match(r"^[\w:.]+\s*(\(.*)$", text)
        if m is None:
            raise SpecError(f"cannot read the schema {text!r} of {qualname}; write it like "
                            f"'(Tensor x, float alpha) -> Tensor'")
        text = m.group(1)
    try:
        fs = torch._C.parse_schema(f"{qualname.split('::')[-1]}{text}")
    except RuntimeError as exc:
        raise SpecError(f"the schema {text!r} of {qualname} does not parse: "
                        f"{str(exc).splitlines()[0]}; write it like '(Tensor x, float alpha) -> Tensor'") from None
    for a in fs.arguments:
        if a.alias_info is not None and a.alias_info.is_write:
            raise SpecError(f"{qualname}: argument {a.name!r} is written to ({text}); opsmith ops are "
                            f"functional: they allocate their outputs from out=. Drop the (a!) and "
                            f"return the result instead")
    rtypes = [str(r.type) for r in fs.returns]
    names = [r.name or "" for r in fs.returns]
    if len(names) == 1:
        names = [names[0] or "out"]
    else:
        names = [n or f"out{i}" for i, n in enumerate(names)]
    return OpSchema(text, [a.name for a in fs.arguments], [str(a.type) for a in fs.arguments],
                    frozenset(a.name for a in fs.arguments if a.kwarg_only), len(fs.returns), names,
                    len(fs.returns) == 1, all(t == "Tensor" for t in rtypes))


def schema_from_kernel(signature) -> tuple[str, list[str]]:
    """The schema a kernel signature implies, and the names of its outputs (see the module doc).

    Examples
    --------
    >>> from opsmith._runtime._signature import KernelSignature
    >>> schema_from_kernel(KernelSignature.parse("relu", "const float* x, float* y, long long n"))
    ('(Tensor x) -> Tensor', ['y'])
    """
    params = list(signature.params)
    count = None
    ints = [p for p in params if p.kind == "int"]
    if ints and ints[-1].name in COUNT_NAMES:
        count = ints[-1].index
    inputs, outputs = [], []
    for p in params:
        if p.index == count:
            continue
        if p.kind == "tensor":
            if "const" in p.ctype.split("*")[0].split():
                inputs.append(f"Tensor {p.name}")
            else:
                outputs.append(p.name)
        elif p.kind in _KIND_TO_SCHEMA:
            inputs.append(f"{_KIND_TO_SCHEMA[p.kind]} {p.name}")
        else:
            raise SpecError(f"kernel {signature.name}: {p.describe()} has no schema type; pass schema=")
    if not outputs:
        raise SpecError(f"kernel {signature.name}({signature.c_params()}) has no output: every pointer is "
                        f"const. Pass schema= and out= to say what the op returns")
    ret = "Tensor" if len(outputs) == 1 else "(" + ", ".join("Tensor" for _ in outputs) + ")"
    return f"({', '.join(inputs)}) -> {ret}", outputs


def schema_from_function(fn: Callable[..., Any]) -> str | None:
    """The schema of a Python function with type annotations (``torch.library.infer_schema``)
    or of a pybind11 function (read from its docstring); None when neither tells it."""
    import inspect
    import types
    if isinstance(fn, types.FunctionType):
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return None
        if not sig.parameters and sig.return_annotation is inspect.Signature.empty:
            return None
        if any(p.annotation is inspect.Parameter.empty for p in sig.parameters.values()):
            return None
        import torch
        try:
            return torch.library.infer_schema(fn, mutates_args=())
        except ValueError as exc:
            raise SpecError(f"cannot derive a schema from {fn.__qualname__}'s annotations: {exc}; "
                            f"pass schema='(Tensor x) -> Tensor'") from None
    return _schema_from_pybind_doc(fn)


def _schema_from_pybind_doc(fn: Callable[..., Any]) -> str | None:
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    name = getattr(fn, "__name__", "")
    if not doc or not name:
        return None
    m = re.match(rf"^{re.escape(name)}\((.*)\)\s*->\s*(.+)$", doc[0].strip())
    if m is None:
        return None
    args = []
    for part in _split(m.group(1)):
        pm = re.match(r"^(\w+)\s*:\s*([\w.:\[\], |]+?)(?:\s*=\s*(.+))?$", part.strip())
        if pm is None:
            return None
        t = _pybind_type(pm.group(2))
        if t is None:
            return None
        default = pm.group(3)
        args.append(f"{t} {pm.group(1)}" + (f"={_default(default, t)}" if default else ""))
    ret = m.group(2).strip()
    rm = re.match(r"^(?:tuple|Tuple|typing\.Tuple)\[(.*)\]$", ret)
    if rm:
        types_ = [_PYBIND_TYPES.get(r.strip()) for r in _split(rm.group(1))]
        if None in types_:
            return None
        rtext = "(" + ", ".join(types_) + ")"  # type: ignore[arg-type]
    else:
        rtext = _PYBIND_TYPES.get(ret)
        if rtext is None:
            return None
    return f"({', '.join(args)}) -> {rtext}"


def _pybind_type(text: str) -> str | None:
    """A pybind11 annotation as a schema type; newer pybind11 writes a number parameter as
    ``typing.SupportsFloat | typing.SupportsIndex``."""
    for alt in text.split("|"):
        t = _PYBIND_TYPES.get(alt.strip())
        if t is not None:
            return t
    return None


def _default(text: str, t: str) -> str:
    text = text.strip()
    if t == "bool":
        return {"True": "True", "False": "False"}.get(text, text)
    return text


def _split(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def is_number(t: str) -> bool:
    """Whether a schema type string is a plain number a kernel takes by value."""
    return t in _NUMBER


def bind_kernel(signature, s, out_names: dict[str, int], args: Sequence[str] | None, qualname: str) -> list[str]:
    """The generated expression for each kernel parameter (an argument's name, ``_o<k>``, ``_n``)."""
    params = list(signature.params)
    where = f"{qualname}: kernel {signature.name}({signature.c_params()})"
    types = dict(zip(s.arg_names, s.arg_types))
    if args is not None:
        if len(args) != len(params):
            raise SpecError(f"{where} takes {len(params)} arguments but args= lists {len(args)}: {list(args)}")
        exprs = []
        for p, a in zip(params, args):
            if a in types:
                exprs.append(a)
            elif a in out_names:
                exprs.append(f"_o{out_names[a]}")
            elif a in ("n", "numel"):
                exprs.append("_n")
            else:
                raise SpecError(f"{where}: args= names {a!r}, which is neither an argument "
                                f"({', '.join(s.arg_names)}), an output ({', '.join(out_names)}) nor 'n'")
        return _check_binding(exprs, params, s, where)
    tensors = [n for n, t in types.items() if t == "Tensor"]
    scalars = [n for n, t in types.items() if is_number(t)]
    outputs = [f"_o{k}" for k in range(s.returns)]
    named = {p.name for p in params}
    tensors = [n for n in tensors if n not in named]
    scalars = [n for n in scalars if n not in named]
    outputs = [o for o in outputs if not any(out_names.get(p.name) == int(o[2:]) for p in params)]
    exprs = []
    for p in params:
        if p.name in types:
            exprs.append(p.name)
        elif p.name in out_names:
            exprs.append(f"_o{out_names[p.name]}")
        elif p.kind == "tensor":
            if tensors:
                exprs.append(tensors.pop(0))
            elif outputs:
                exprs.append(outputs.pop(0))
            else:
                raise SpecError(f"{where}: nothing left for {p.describe()}; pass args=")
        elif p.kind == "int" and p.name in COUNT_NAMES:
            exprs.append("_n")
        elif scalars:
            exprs.append(scalars.pop(0))
        elif p.kind == "int":
            exprs.append("_n")
        else:
            raise SpecError(f"{where}: nothing left for {p.describe()}; pass args=")
    return _check_binding(exprs, params, s, where)


def _check_binding(exprs: list[str], params, s, where: str) -> list[str]:
    types = dict(zip(s.arg_names, s.arg_types))
    for p, e in zip(params, exprs):
        is_tensor = e.startswith("_o") or types.get(e) == "Tensor"
        if (p.kind == "tensor") != is_tensor:
            raise SpecError(f"{where}: {p.describe()} would take {e.replace('_o', 'output ')} "
                            f"({'a tensor' if is_tensor else 'a number'}); pass args= in kernel order")
        if e in types and types[e] != "Tensor" and not is_number(types[e]):
            raise SpecError(f"{where}: argument {e!r} is a {types[e]}, which a kernel cannot take")
    used = set(exprs)
    missing = [n for n, t in types.items() if t == "Tensor" and n not in used]
    missing += [f"output {k}" for k in range(s.returns) if f"_o{k}" not in used]
    if missing:
        raise SpecError(f"{where} does not receive {', '.join(missing)}; name the kernel's parameters like "
                        f"the op's arguments or pass args= (e.g. args={['x', 'out', 'n']!r})")
    return exprs
