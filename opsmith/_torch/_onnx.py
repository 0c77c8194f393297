"""opsmith ops in ONNX: the ORT op library built from ``opsmith.custom_op`` ops, and the
``torch.onnx.export`` pieces that emit their nodes.

One description, many consumers: an op's schema, output specs and kernels (the same ones its
torch CUDA implementation launches) give the :class:`~opsmith._build._ort_lib.OrtOpSpec`
the library generator reads, the ``custom_translation_table`` entries of the dynamo exporter
(onnxscript) and the TorchScript exporter's symbolics. A node is ``<namespace>.<name>``: the
op ``mylib::relu`` becomes op_type ``relu`` in domain ``mylib`` (opset 1).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from opsmith._errors import SpecError

__all__ = ["build_library", "ort_specs", "translation_table", "register_symbolics", "export", "RELU_CPU_SOURCE"]

#: A C++ CPU ReLU for the tutorial's ``relu_fwd<T>`` kernel (docs/torch_ops.md): the kernel's
#: parameters and the optional ``opsmith::cpu_context`` (docs/onnx.md, "CPU functions"), templated
#: so that one definition serves float and double. It computes what ONNX Runtime's ``Relu`` and
#: ``torch.relu`` give bit for bit: ``x < 0 ? 0 : x``, so NaN stays the same NaN and -0.0 stays
#: -0.0. Chunks of 16 Ki items run on ORT's intra-op threads; the loop has no branch, and the
#: compiler vectorises it (-O3, with a run-time check that x and y do not overlap).
RELU_CPU_SOURCE = r"""
template <typename T> static void relu_cpu_chunk(const T *x, T *y, long long n) {
  for (long long i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
}
template <typename T> static void relu_cpu(const T *x, T *y, long long n, const opsmith::cpu_context &cpu) {
  cpu.parallel_for(n, 1 << 14, [=](long long begin, long long end) { relu_cpu_chunk(x + begin, y + begin, end - begin); });
}
"""


def _ops(ops) -> list:
    from opsmith._torch._ops import _OPS, CustomOp
    if ops is None:
        return list(_OPS.values())
    if isinstance(ops, CustomOp):
        return [ops]
    out = []
    for o in ops:
        if isinstance(o, str):
            if o not in _OPS:
                raise SpecError(f"no opsmith op {o!r} is registered in this process; registered: "
                                f"{', '.join(_OPS) or 'none'}")
            o = _OPS[o]
        if not isinstance(o, CustomOp):
            raise SpecError(f"ops= takes opsmith.custom_op ops or their names, got {o!r}")
        out.append(o)
    return out


def _first_dtype(kernel) -> str:
    for p in kernel.params:
        if p.kind == "tensor" and len(p.dtypes) == 1:
            return p.dtypes[0]
    raise SpecError(f"kernel {kernel.name}: its first typed pointer gives the ONNX element type, and it has none")


def ort_specs(ops=None, cpu: Mapping[str, str] | None = None, dtypes: Mapping[str, Sequence[str]] | None = None,
              items_per_thread: Mapping[str, int] | None = None):
    """``(specs, cuda_sources)`` for :func:`~opsmith._build._ort_lib.build_ort_library`.

    ``cpu`` maps an op's name (``"mylib::relu"``) to the C++ function (in ``cpu_source``)
    the CPU provider calls with the kernel's own arguments. ``dtypes`` gives the dtypes of
    an op that has no kernel (its CPU function then takes ``(const T* in..., T* out...,
    long long n)``).
    """
    from opsmith._build._export_c import _c_param
    from opsmith._build._ort_lib import OrtOpSpec, OrtVariant
    from opsmith._torch._outspec import _input_index
    cpu = dict(cpu or {})
    dtypes = dict(dtypes or {})
    ops = _ops(ops)
    known = {o.name for o in ops}
    for k in list(cpu) + list(dtypes):
        if k not in known:
            raise SpecError(f"cpu=/dtypes= name {k!r}, which is not among the ops exported "
                            f"({', '.join(sorted(known))})")
    specs, sources, source_index = [], [], {}
    for op in ops:
        s = op.schema
        where = f"{op.name} in ONNX Runtime"
        bad = [f"{n}: {t}" for n, t in zip(s.arg_names, s.arg_types) if t != "Tensor"]
        if bad:
            raise SpecError(f"{where}: only tensor arguments become ORT inputs; {', '.join(bad)} would need an "
                            f"ONNX attribute, which opsmith does not generate yet. Make it a tensor or keep this "
                            f"op out of the model")
        tensors = list(range(len(s.arg_names)))
        like = []
        for k, o in enumerate(op.outs):
            if o.shape is not None or o.dtype is not None or o.zeros:
                raise SpecError(f"{where}: output {k} is {o!r}; the ORT op allocates outputs like an input "
                                f"(Out() or Out(like=...)) and nothing else yet")
            like.append(_input_index(o.like, s.arg_names, s.arg_types, tensors, what="like"))
        kernels = getattr(op, "_kernels", None) or []
        variants = []
        if kernels:
            if getattr(op, "_launch_rule", None) is not None and op.name not in (items_per_thread or {}):
                raise SpecError(f"{where}: launch= is a Python rule; the ORT op launches elementwise (256 "
                                f"threads per block over output 0's items). Register the op without launch=, "
                                f"or, for a rule that is config_for(n, items_per_thread=K), pass "
                                f"items_per_thread={{{op.name!r}: K}} to build_library")
            binding = []
            for e in op._binding:
                if e == "_n":
                    binding.append("n")
                elif e.startswith("_o"):
                    binding.append(f"out{e[2:]}")
                else:
                    binding.append(f"in{s.arg_names.index(e)}")
            for kern in kernels:
                req = getattr(kern.module, "_request", None)
                if req is None:
                    raise SpecError(f"{where}: kernel {kern.name} was loaded from a binary; the ORT library "
                                    f"compiles kernels from their source")
                src_key = (req.source, req.include_paths, req.defines, req.headers, req.options, req.std)
                if src_key not in source_index:
                    source_index[src_key] = len(sources)
                    sources.append({"sources": [req.source], "include_paths": list(req.include_paths),
                                    "defines": {k: v for k, v in req.defines} or None,
                                    "headers": dict(req.headers) or None, "options": list(req.options),
                                    "std": req.std})
                used: set[str] = set()
                c_params = [_c_param(p, used) for p in kern.signature.params]
                variants.append(OrtVariant(dtype=_first_dtype(kern), c_params=tuple(c_params),
                                           binding=tuple(binding), kernel=kern.name,
                                           module=source_index[src_key]))
        else:
            if op.name not in cpu:
                raise SpecError(f"{where}: the op has no opsmith kernel (its CUDA implementation is a Python "
                                f"function), so the library needs a CPU function for it: cpu={{'{op.name}': "
                                f"'fn'}} with cpu_source=")
            from opsmith._build._export_c import _BY_DTYPE
            for dt in dtypes.get(op.name, ("float32",)):
                ct = _BY_DTYPE.get(dt)
                if ct is None:
                    raise SpecError(f"{where}: dtype {dt!r} has no C type; use one of {', '.join(_BY_DTYPE)}")
                params = [f"const {ct} *in{i}" for i in range(len(s.arg_names))] + \
                         [f"{ct} *out{k}" for k in range(s.returns)] + ["long long n"]
                bind = [f"in{i}" for i in range(len(s.arg_names))] + [f"out{k}" for k in range(s.returns)] + ["n"]
                variants.append(OrtVariant(dtype=dt, c_params=tuple(params), binding=tuple(bind)))
        seen_dt = [v.dtype for v in variants]
        if len(set(seen_dt)) != len(seen_dt):
            raise SpecError(f"{where}: two kernels take {seen_dt}; one kernel per dtype")
        ns, name = op.name.split("::")
        specs.append(OrtOpSpec(domain=ns, name=name, inputs=len(s.arg_names), outputs=s.returns,
                               like=tuple(like), variants=tuple(variants), cpu=cpu.get(op.name),
                               items_per_thread=_items_per_thread(items_per_thread, op.name)))
    return specs, sources


def build_library(ops=None, *, cpu_source: str | os.PathLike | None = None, cpu: Mapping[str, str] | None = None,
                  dtypes: Mapping[str, Sequence[str]] | None = None, name: str = "opsmith_ops",
                  archs: Iterable[str] | None = None, out_dir: str | os.PathLike | None = None,
                  items_per_thread: Mapping[str, int] | None = None):
    """Build an ONNX Runtime custom-op library from opsmith ops.

    Parameters
    ----------
    ops : CustomOp, list of CustomOp or op names, optional
        The ops (default: every ``opsmith.custom_op`` op of this process).
    cpu_source : str or path, optional
        C++ source defining the CPU implementations (a path or the text).
    cpu : dict, optional
        ``{"mylib::relu": "relu_cpu"}``: the function the CPU provider calls, with the same
        arguments as the op's kernel (``relu_cpu(x, y, n)``; a template or overloads serve
        several dtypes). Ops without an entry run on the CUDA provider only.
    dtypes : dict, optional
        Dtypes of ops that have no kernel (default float32).
    name : str
        The library is ``lib<name>.so``.
    archs : list of str, optional
        GPU archs to embed code for (default: as ``opsmith export-c``).
    out_dir : path, optional
        Where to put it (default: under opsmith's cache directory, by content hash).
    items_per_thread : dict, optional
        ``{"mylib::relu": 4}``: items one CUDA thread handles (a kernel with vector loads), so
        the grid is ``ceil(n / (256 * 4))`` blocks, as the torch op's
        ``kernel.config_for(n, items_per_thread=4)``. Default 1.

    Returns
    -------
    OrtLibrary
        ``.path`` is the shared library; pass it to :func:`opsmith.onnx.session_options`.

    Examples
    --------
    >>> lib = opsmith.onnx.build_library([relu], cpu_source=opsmith.onnx.RELU_CPU_SOURCE,
    ...                                  cpu={"mylib::relu": "relu_cpu"})   # doctest: +SKIP
    """
    from opsmith._build._ort_lib import build_ort_library
    text = ""
    if cpu_source is not None:
        if isinstance(cpu_source, os.PathLike) or (isinstance(cpu_source, str) and "\n" not in cpu_source
                                                   and cpu_source.endswith((".cpp", ".cc", ".h", ".hpp"))):
            try:
                text = Path(cpu_source).read_text()
            except OSError as exc:
                raise SpecError(f"cannot read the CPU source {cpu_source}: {exc.strerror}") from None
        else:
            text = str(cpu_source)
    if cpu and not text:
        raise SpecError("cpu= names CPU functions but no cpu_source= defines them; pass the C++ source")
    specs, sources = ort_specs(ops, cpu, dtypes, items_per_thread)
    if not specs:
        raise SpecError("no opsmith op to build an ONNX Runtime library from: register ops with "
                        "opsmith.custom_op first, or pass ops=")
    return build_ort_library(specs, name=name, cuda_sources=sources, cpu_source=text, archs=archs, out_dir=out_dir)


def _items_per_thread(table: Mapping[str, int] | None, name: str) -> int:
    value = (table or {}).get(name, 1)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 64:
        raise SpecError(f"items_per_thread[{name!r}] = {value!r}: give an int from 1 to 64 (items one "
                        f"CUDA thread handles)")
    return value


# -- export -------------------------------------------------------------------------------------
def translation_table(ops=None) -> dict:
    """``custom_translation_table`` entries for ``torch.onnx.export(..., dynamo=True)``: each
    op's ``OpOverload`` -> an onnxscript function emitting ``<namespace>.<name>`` (opset 1)."""
    import onnxscript
    table = {}
    for op in _ops(ops):
        ns, name = op.name.split("::")
        opset = onnxscript.values.Opset(ns, 1)
        n_out = op.schema.returns
        table[op.default] = _emitter(opset, _onnx_schema(op), name, n_out)
    return table


_ONNX_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)", "tensor(int8)",
               "tensor(int16)", "tensor(int32)", "tensor(int64)", "tensor(uint8)", "tensor(bool)")


def _onnx_schema(op):
    """An ``onnx.defs.OpSchema`` of the node (onnxscript needs one to emit it; not registered
    globally): the op's tensor arguments and outputs, all of one type ``T``."""
    from onnx.defs import OpSchema
    ns, name = op.name.split("::")
    s = op.schema
    param = OpSchema.FormalParameter
    return OpSchema(name, ns, 1, doc=f"opsmith op {op.name}{s.text}",
                    inputs=[param(n, "T") for n in s.arg_names],
                    outputs=[param(n, "T") for n in s.return_names],
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
        from opsmith._errors import OpsmithError
        raise OpsmithError(f"torch {torch.__version__} has no TorchScript ONNX exporter "
                           f"(torch.onnx.register_custom_op_symbolic); export with dynamo=True")
    for op in _ops(ops):
        if op.name in _SYMBOLICS:
            continue
        ns, name = op.name.split("::")
        n_out = op.schema.returns

        def symbolic(g, *args, _q=f"{ns}::{name}", _n=n_out):
            out = g.op(_q, *args, outputs=_n)
            outs = out if _n > 1 else [out]
            for o in outs:  # like the first input (the default output spec)
                o.setType(args[0].type())
            return out

        torch.onnx.register_custom_op_symbolic(op.name, symbolic, 1)
        _SYMBOLICS.add(op.name)


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
    chosen = _ops(ops)
    if dynamo:
        table = dict(kwargs.pop("custom_translation_table", None) or {})
        table.update(translation_table(chosen))
        result = torch.onnx.export(model, args, f, dynamo=True, custom_translation_table=table, **kwargs)
    else:
        register_symbolics(chosen)
        opsets = dict(kwargs.pop("custom_opsets", None) or {})
        for op in chosen:
            opsets.setdefault(op.name.split("::")[0], 1)
        result = torch.onnx.export(model, args, f, dynamo=False, custom_opsets=opsets, **kwargs)
    if ir_version is not None:
        if f is None or not isinstance(f, (str, os.PathLike)):
            raise SpecError("ir_version= rewrites the saved file: pass a path as f")
        import onnx
        proto = onnx.load(os.fspath(f), load_external_data=False)
        proto.ir_version = int(ir_version)
        onnx.save(proto, os.fspath(f))
    return result
