"""``torch.onnx.export`` with opsmith's ops as their own nodes: the dynamo exporter's translation
table (onnxscript), the TorchScript exporter's symbolics, and :func:`export` over both.

Every piece is made from the ops' :class:`~opsmith._opdesc.OpDescription`: the node of
``mylib::relu`` is op_type ``relu`` in domain ``mylib`` (opset 1), with the op's tensor
arguments as inputs and its outputs. torch is imported when these functions run, not before.
"""
from __future__ import annotations

import os
from typing import Any

from opsmith._errors import OpsmithError, SpecError
from opsmith.onnx._specs import descriptions

__all__ = ["translation_table", "register_symbolics", "export"]

_ONNX_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)", "tensor(int8)",
               "tensor(int16)", "tensor(int32)", "tensor(int64)", "tensor(uint8)", "tensor(bool)")


def _overload(desc, required: bool = True):
    """``torch.ops.<namespace>.<name>.default``: the op torch traces (defined by the torch target);
    None when torch has no such op and ``required`` is False."""
    import torch
    try:
        return getattr(getattr(torch.ops, desc.namespace), desc.op_name).default
    except (AttributeError, RuntimeError):
        if not required:
            return None
        raise SpecError(f"op {desc.name} is described but torch has no torch.ops.{desc.namespace}."
                        f"{desc.op_name}: define it with opsmith.custom_op in this process before "
                        f"exporting") from None


def _exported(ops) -> list:
    """The descriptions of ``ops``; for None, those of every op torch has in this process (a
    description without a torch op, e.g. one read from a package, cannot be in a traced model)."""
    if ops is None:
        return [d for d in descriptions(None) if _overload(d, required=False) is not None]
    return descriptions(ops)


def translation_table(ops=None) -> dict:
    """``custom_translation_table`` entries for ``torch.onnx.export(..., dynamo=True)``: each
    op's ``OpOverload`` -> an onnxscript function emitting ``<namespace>.<name>`` (opset 1)."""
    import onnxscript
    table = {}
    for d in _exported(ops):
        opset = onnxscript.values.Opset(d.namespace, 1)
        table[_overload(d)] = _emitter(opset, _onnx_schema(d), d.op_name, d.returns)
    return table


def _onnx_schema(desc):
    """An ``onnx.defs.OpSchema`` of the node (onnxscript needs one to emit it; not registered
    globally): the op's tensor arguments and outputs, all of one type ``T``."""
    from onnx.defs import OpSchema
    param = OpSchema.FormalParameter
    return OpSchema(desc.op_name, desc.namespace, 1, doc=f"opsmith op {desc.name}{desc.schema}",
                    inputs=[param(n, "T") for n in desc.arg_names],
                    outputs=[param(n, "T") for n in desc.return_names],
                    type_constraints=[("T", list(_ONNX_TYPES), "")])


def _emitter(opset, schema, name: str, n_out: int):
    import onnxscript
    node = onnxscript.values.Op(opset, name, schema)

    def emit(*args, **kwargs):
        if n_out == 1:
            return node(*args)
        return node(*args, _num_outputs=n_out)
    emit.__name__ = f"opsmith_{name}"
    return emit


_SYMBOLICS: set[str] = set()


def register_symbolics(ops=None) -> None:
    """Register TorchScript-exporter symbolics (``dynamo=False``) emitting each op's node."""
    import torch
    if not hasattr(torch.onnx, "register_custom_op_symbolic"):
        raise OpsmithError(f"torch {torch.__version__} has no TorchScript ONNX exporter "
                           f"(torch.onnx.register_custom_op_symbolic); export with dynamo=True")
    for d in _exported(ops):
        if d.name in _SYMBOLICS:
            continue

        def symbolic(g, *args, _q=d.name, _n=d.returns):
            out = g.op(_q, *args, outputs=_n)
            outs = out if _n > 1 else [out]
            for o in outs:  # like the first input (the default output spec)
                o.setType(args[0].type())
            return out

        torch.onnx.register_custom_op_symbolic(d.name, symbolic, 1)
        _SYMBOLICS.add(d.name)


def export(model, args: tuple, f: str | os.PathLike | None = None, *, ops=None, dynamo: bool = True,
           ir_version: int | None = None, **kwargs: Any):
    """``torch.onnx.export`` with opsmith's ops emitted as their own nodes.

    ``dynamo=True`` passes :func:`translation_table` as ``custom_translation_table``;
    ``dynamo=False`` registers :func:`register_symbolics` and the ops' domains as
    ``custom_opsets``. Other keyword arguments go to ``torch.onnx.export``.
    ``ir_version`` rewrites the saved file's IR version (ORT 1.15 reads IR 9 at most; pair it
    with ``opset_version=18``).

    Examples
    --------
    >>> opsmith.onnx.export(model, (x,), "model.onnx")               # doctest: +SKIP
    """
    import torch
    chosen = _exported(ops)
    if dynamo:
        table = dict(kwargs.pop("custom_translation_table", None) or {})
        table.update(translation_table(chosen))
        result = torch.onnx.export(model, args, f, dynamo=True, custom_translation_table=table, **kwargs)
    else:
        register_symbolics(chosen)
        opsets = dict(kwargs.pop("custom_opsets", None) or {})
        for d in chosen:
            opsets.setdefault(d.namespace, 1)
        result = torch.onnx.export(model, args, f, dynamo=False, custom_opsets=opsets, **kwargs)
    if ir_version is not None:
        if f is None or not isinstance(f, (str, os.PathLike)):
            raise SpecError("ir_version= rewrites the saved file: pass a path as f")
        import onnx
        proto = onnx.load(os.fspath(f), load_external_data=False)
        proto.ir_version = int(ir_version)
        onnx.save(proto, os.fspath(f))
    return result
