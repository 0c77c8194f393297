"""Output specs of an op: what each output looks like, so that the op allocates it and fakes it.

An :class:`Out` says where an output's shape, dtype and device come from: "like input
``x``" (the default), a shape function of the op's arguments, a dtype rule. From the specs
of an op's outputs two pieces of Python are generated: the allocation lines of the real
implementation (``torch.empty_like(x)`` when it can, the cheapest allocation) and the fake
kernel that ``FakeTensorMode``, ``torch.compile`` and ``torch.export`` run (contiguous
empty tensors of the same shapes and dtypes, never touching data).
"""
from __future__ import annotations

from typing import Any, Callable

from opsmith._errors import SpecError

__all__ = ["Out", "alloc_lines", "describe_out", "fingerprint"]


class Out:
    """How one output of an op is allocated: its shape, dtype and device.

    Parameters
    ----------
    like : str or int, optional
        The tensor input (by name or position among the op's arguments) whose shape, dtype
        and device the output takes. Default: the op's first tensor input.
    shape : callable, optional
        ``shape(*args)`` receives the op's arguments (fake tensors while tracing: read only
        shapes) and returns the output's shape. Default: ``like``'s shape.
    dtype : torch.dtype, str, int or callable, optional
        A dtype; an input's name or position (that input's dtype); or ``dtype(*args)``.
        Default: ``like``'s dtype.
    zeros : bool
        Fill the output with zeros (for kernels that accumulate) instead of leaving it empty.

    Examples
    --------
    >>> Out()                                              # like the first tensor input
    Out()
    >>> Out(like="x", dtype="int64")                       # doctest: +SKIP
    >>> Out(shape=lambda x, dim: x.shape[:dim], zeros=True)  # doctest: +ELLIPSIS
    Out(shape=<function <lambda> at ...>, zeros=True)
    """

    __slots__ = ("like", "shape", "dtype", "zeros")

    def __init__(self, like: str | int | None = None, *, shape: Callable[..., Any] | None = None,
                 dtype: Any = None, zeros: bool = False) -> None:
        if like is not None and not isinstance(like, (str, int)):
            raise SpecError(f"Out(like=...) names a tensor input by name or position, got {like!r}")
        if shape is not None and not callable(shape):
            raise SpecError(f"Out(shape=...) is a function of the op's arguments that returns the "
                            f"shape, got {shape!r}; write shape=lambda x: (x.shape[0],)")
        self.like, self.shape, self.dtype, self.zeros = like, shape, dtype, bool(zeros)

    def __repr__(self) -> str:
        parts = [f"{n}={getattr(self, n)!r}" for n in self.__slots__
                 if getattr(self, n) not in (None, False)]
        return f"Out({', '.join(parts)})"


def _dtype_value(dtype: Any):
    import torch
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        return getattr(torch, dtype)
    return None


def alloc_lines(outs: list[Out], arg_names: list[str], arg_types: list[str], var: Callable[[int], str],
                ns: dict[str, Any], *, fake: bool) -> list[str]:
    """Python lines that bind ``_o0, _o1, ...`` to newly allocated outputs.

    ``arg_names``/``arg_types`` are the op's arguments (schema names and type strings),
    ``var(i)`` the variable that holds argument ``i`` in the generated function. Constants
    the lines use are put into ``ns``. ``fake=True`` allocates for the fake kernel (inputs
    may be non-contiguous there; the real implementation made them contiguous first).
    """
    tensors = [i for i, t in enumerate(arg_types) if t == "Tensor"]
    args = ", ".join(var(i) for i in range(len(arg_names)))
    lines = []
    for k, out in enumerate(outs):
        like = _input_index(out.like, arg_names, arg_types, tensors, what="like")
        lv = var(like)
        dt = out.dtype
        if dt is None:
            dtype_expr = None
        elif _dtype_value(dt) is not None:
            ns[f"_DT{k}"] = _dtype_value(dt)
            dtype_expr = f"_DT{k}"
        elif isinstance(dt, (str, int)) and not isinstance(dt, bool):
            dtype_expr = f"{var(_input_index(dt, arg_names, arg_types, tensors, what='dtype'))}.dtype"
        elif callable(dt):
            ns[f"_DTF{k}"] = dt
            dtype_expr = f"_DTF{k}({args})"
        else:
            raise SpecError(f"Out(dtype={dt!r}): give a torch.dtype, an input's name or position, "
                            f"or a function of the op's arguments")
        fill = "zeros" if out.zeros else "empty"
        if out.shape is None:
            kw = "" if dtype_expr is None else f", dtype={dtype_expr}"
            if fake:  # the real one allocates like a contiguous input: so must the fake
                kw += ", memory_format=_CONTIGUOUS"
            lines.append(f"    _o{k} = _{fill}_like({lv}{kw})")
        else:
            ns[f"_SHAPE{k}"] = out.shape
            dtype_expr = dtype_expr or f"{lv}.dtype"
            lines.append(f"    _o{k} = _{fill}(_SHAPE{k}({args}), dtype={dtype_expr}, device={lv}.device)")
    return lines


def describe_out(out: Out, arg_names: list[str], arg_types: list[str]):
    """``out`` as plain data (:class:`~opsmith._opdesc.OutDescription`): the argument indices
    its ``like`` and dtype name, a dtype name, or which of its parts are Python functions."""
    from opsmith._opdesc import OutDescription
    tensors = [i for i, t in enumerate(arg_types) if t == "Tensor"]
    like = _input_index(out.like, arg_names, arg_types, tensors, what="like")
    dt, fields = out.dtype, {}
    if dt is not None:
        value = _dtype_value(dt)
        if value is not None:
            fields["dtype"] = str(value).rpartition(".")[2]  # torch.int64 -> "int64"
        elif isinstance(dt, (str, int)) and not isinstance(dt, bool):
            fields["dtype_like"] = _input_index(dt, arg_names, arg_types, tensors, what="dtype")
        else:
            fields["dtype_rule"] = True
    return OutDescription(like=like, shape_rule=out.shape is not None, zeros=out.zeros, **fields)


def _input_index(ref, arg_names: list[str], arg_types: list[str], tensors: list[int], *, what: str) -> int:
    if ref is None:
        if not tensors:
            raise SpecError("an output without like= needs a tensor input to take its shape, dtype and "
                            "device from; this op has none: give Out(shape=..., dtype=...) and an input")
        return tensors[0]
    if isinstance(ref, int) and not isinstance(ref, bool):
        if not 0 <= ref < len(arg_names):
            raise SpecError(f"Out({what}={ref}): the op has {len(arg_names)} arguments ({', '.join(arg_names)})")
        i = ref
    elif ref in arg_names:
        i = arg_names.index(ref)
    else:
        raise SpecError(f"Out({what}={ref!r}): no argument of that name; the op's arguments are "
                        f"{', '.join(arg_names) or 'none'}")
    if arg_types[i] != "Tensor":
        raise SpecError(f"Out({what}={ref!r}): argument {arg_names[i]!r} is a {arg_types[i]}, not a Tensor")
    return i


def fingerprint(obj: Any) -> Any:
    """A value equal for the same definition across re-runs of a script or notebook cell.

    Functions compare by module, qualified name, bytecode and constants (a re-run makes a
    new function object with the same code); extension functions by module, name and
    docstring; opsmith kernels by source, symbol and signature; containers item by item.
    """
    import types
    if obj is None or isinstance(obj, (str, int, float, bool, bytes)):
        return obj
    if isinstance(obj, (list, tuple)):
        return tuple(fingerprint(o) for o in obj)
    if isinstance(obj, dict):
        return tuple(sorted((repr(k), fingerprint(v)) for k, v in obj.items()))
    if isinstance(obj, Out):
        return ("Out", *(fingerprint(getattr(obj, n)) for n in Out.__slots__))
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        return ("fn", obj.__module__, obj.__qualname__, code.co_code,
                tuple(fingerprint(c) if not isinstance(c, types.CodeType) else c.co_code
                      for c in code.co_consts))
    if isinstance(obj, types.MethodType):
        return ("method", fingerprint(obj.__func__), id(obj.__self__))
    signature = getattr(obj, "signature", None)
    if hasattr(signature, "to_json") and hasattr(obj, "module"):  # an opsmith Kernel
        module = obj.module
        source = getattr(getattr(module, "_request", None), "source", None) or module.binary.source
        return ("kernel", source, obj.symbol, repr(signature.to_json()))
    if isinstance(obj, types.BuiltinFunctionType) or type(obj).__name__ == "builtin_function_or_method":
        return ("builtin", getattr(obj, "__module__", None), obj.__name__, obj.__doc__)
    overload = getattr(obj, "_schema", None)
    if overload is not None:  # a torch OpOverload
        return ("torch-op", str(overload))
    return ("object", repr(obj))
