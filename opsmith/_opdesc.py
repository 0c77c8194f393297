"""What an op is, as plain data: :class:`OpDescription`, and the process-wide registry of them.

One description, many consumers. The torch target (``opsmith.custom_op``) describes each op
it registers; the ONNX Runtime target (``opsmith.onnx``) and, later, packaged wheels read
only these descriptions, never the torch objects. Everything here is JSON-serialisable:
:meth:`OpDescription.to_json` carries a format name and version, and
:meth:`OpDescription.from_json` refuses another version with a message that says so.

A base module: the standard library, :mod:`opsmith._record` and :mod:`opsmith._errors` only.

Examples
--------
>>> d = OpDescription(name="mylib::relu", schema="(Tensor x) -> Tensor", arg_names=("x",),
...                   arg_types=("Tensor",), return_names=("out",), outs=(OutDescription(like=0),))
>>> OpDescription.from_json(d.to_json()) == d
True
"""
from __future__ import annotations

import threading
from typing import Any

from opsmith._errors import SpecError
from opsmith._record import Record

__all__ = ["OpDescription", "OutDescription", "KernelDescription", "register", "get", "all_descriptions",
           "FORMAT", "VERSION"]

FORMAT = "opsmith.op-description"
VERSION = 1


class OutDescription(Record):
    """How one output is allocated: ``like`` (the index of the argument whose shape, dtype and
    device it takes), ``shape_rule`` (True: a Python function of the arguments gives the
    shape), ``dtype`` (a dtype name such as ``"int64"``, or None: ``like``'s), ``dtype_like``
    (the index of the argument whose dtype it takes, or None), ``dtype_rule`` (True: a Python
    function gives the dtype) and ``zeros`` (filled with zeros, not left empty)."""

    __slots__ = ("like", "shape_rule", "dtype", "dtype_like", "dtype_rule", "zeros")
    _defaults = {"shape_rule": False, "dtype": None, "dtype_like": None, "dtype_rule": False, "zeros": False}

    def like_only(self) -> bool:
        """True when the output is allocated exactly like its ``like`` argument."""
        return not (self.shape_rule or self.dtype is not None or self.dtype_like is not None
                    or self.dtype_rule or self.zeros)

    def describe(self) -> str:
        """``"like argument 0, shape from a Python function, zeros"``: what differs from "like"."""
        parts = [f"like argument {self.like}"]
        if self.shape_rule:
            parts.append("shape from a Python function")
        if self.dtype is not None:
            parts.append(f"dtype {self.dtype}")
        if self.dtype_like is not None:
            parts.append(f"dtype of argument {self.dtype_like}")
        if self.dtype_rule:
            parts.append("dtype from a Python function")
        if self.zeros:
            parts.append("zeros")
        return ", ".join(parts)


class KernelDescription(Record):
    """One kernel of an op: ``name`` (its name expression, ``"relu<float>"``), ``signature``
    (``KernelSignature.to_json()``: a dict) and ``request`` (how to compile it again: a dict of
    ``source``, ``include_paths``, ``defines`` (``[[name, value], ...]``), ``headers``
    (``[[name, text], ...]``), ``options`` and ``std``; None for a kernel loaded from a binary)."""

    __slots__ = ("name", "signature", "request")
    _defaults = {"request": None}

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))


class OpDescription(Record):
    """An op, as plain data.

    Attributes
    ----------
    name : str
        ``"namespace::name"``.
    schema : str
        The schema text, ``"(Tensor x, float alpha) -> Tensor"``.
    arg_names, arg_types : tuple of str
        The arguments' names and schema types (``"Tensor"``, ``"float"``, ...).
    kwarg_only : tuple of str
        The names of the keyword-only arguments.
    return_names : tuple of str
        One name per output (``"out"``, ``"out0"``... where the schema names none).
    outs : tuple of OutDescription
        How each output is allocated.
    kernels : tuple of KernelDescription
        The CUDA kernels (one per dtype); empty when the op's implementations are functions.
    binding : tuple of str
        What each kernel parameter receives: ``"arg<k>"`` (argument k), ``"out<k>"`` (output
        k) or ``"n"`` (output 0's item count). Empty without kernels.
    launch_rule : bool
        True when a Python function decides the launch config (``launch=``); False: the
        elementwise default (256 threads per block over output 0's items).
    """

    __slots__ = ("name", "schema", "arg_names", "arg_types", "kwarg_only", "return_names", "outs", "kernels",
                 "binding", "launch_rule")
    _defaults = {"kwarg_only": (), "kernels": (), "binding": (), "launch_rule": False}

    @property
    def namespace(self) -> str:
        return self.name.split("::")[0]

    @property
    def op_name(self) -> str:
        return self.name.split("::")[-1]

    @property
    def returns(self) -> int:
        return len(self.return_names)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``json.dumps`` takes it as is), with the format and its version."""
        return {"format": FORMAT, "version": VERSION, "name": self.name, "schema": self.schema,
                "arg_names": list(self.arg_names), "arg_types": list(self.arg_types),
                "kwarg_only": list(self.kwarg_only), "return_names": list(self.return_names),
                "outs": [o._asdict() for o in self.outs],
                "kernels": [{"name": k.name, "signature": k.signature, "request": k.request} for k in self.kernels],
                "binding": list(self.binding), "launch_rule": self.launch_rule}

    @classmethod
    def from_json(cls, data: Any) -> "OpDescription":
        """The description :meth:`to_json` gave; :class:`~opsmith.SpecError` for another format
        or version, or a field missing."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SpecError(f"not an opsmith op description (format {FORMAT!r} expected, got "
                            f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r})")
        if data.get("version") != VERSION:
            raise SpecError(f"op description {data.get('name', '?')!r} is of version {data.get('version')!r}; "
                            f"this opsmith reads version {VERSION}: rebuild the package that carries it with "
                            f"this opsmith, or install the opsmith it was made with")
        try:
            return cls(name=data["name"], schema=data["schema"], arg_names=tuple(data["arg_names"]),
                       arg_types=tuple(data["arg_types"]), kwarg_only=tuple(data["kwarg_only"]),
                       return_names=tuple(data["return_names"]),
                       outs=tuple(OutDescription(**o) for o in data["outs"]),
                       kernels=tuple(KernelDescription(k["name"], k["signature"], k["request"])
                                     for k in data["kernels"]),
                       binding=tuple(data["binding"]), launch_rule=bool(data["launch_rule"]))
        except (KeyError, TypeError) as exc:
            raise SpecError(f"op description {data.get('name', '?')!r} is incomplete or malformed "
                            f"({type(exc).__name__}: {exc})") from None


_REGISTRY: dict[str, OpDescription] = {}
_lock = threading.Lock()


def register(desc: OpDescription) -> None:
    """Make ``desc`` the description of its op in this process (replacing an earlier one)."""
    if not isinstance(desc, OpDescription):
        raise SpecError(f"register() takes an OpDescription, got {desc!r}")
    with _lock:
        _REGISTRY[desc.name] = desc


def get(name: str) -> OpDescription:
    """The description of the op ``name`` (``"mylib::relu"``); :class:`~opsmith.SpecError`
    naming the registered ops when there is none."""
    found = _REGISTRY.get(name)
    if found is None:
        raise SpecError(f"no opsmith op {name!r} is registered in this process; registered: "
                        f"{', '.join(sorted(_REGISTRY)) or 'none'} (define it with opsmith.custom_op first)")
    return found


def all_descriptions() -> list[OpDescription]:
    """Every registered description, in registration order."""
    with _lock:
        return list(_REGISTRY.values())
