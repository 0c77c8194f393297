"""From op descriptions to the ops of an ONNX Runtime library: :class:`OrtOpSpec`, :func:`ort_specs`.

An op is read from its :class:`~opsmith._opdesc.OpDescription` (what ``opsmith.custom_op``
registers), never from the torch objects: its arguments and outputs, "like input k" output
specs, the kernels' signatures and compile requests, how the kernel parameters are bound. A
node is ``<namespace>.<name>``: the op ``mylib::relu`` becomes op_type ``relu`` in domain
``mylib`` (opset 1).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from opsmith._errors import SpecError
from opsmith._opdesc import OpDescription, all_descriptions, get
from opsmith._record import Record

__all__ = ["OrtOpSpec", "OrtVariant", "ort_specs", "descriptions", "validate", "ONNX_DTYPES"]

#: torch dtype name -> ONNXTensorElementDataType value.
ONNX_DTYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
               "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "bfloat16": 16}


class OrtVariant(Record):
    """One dtype of an op: ``dtype`` (``"float32"``), ``c_params`` (the kernel's C parameters,
    ``["const float *x", "float *y", "long long n"]``), ``binding`` (what each receives:
    ``"in0"``, ``"out0"``, ``"n"``), ``kernel`` (the name expression of its CUDA kernel,
    ``"relu<float>"``, or None: no CUDA implementation) and ``module`` (index into the
    library's CUDA sources)."""

    __slots__ = ("dtype", "c_params", "binding", "kernel", "module")
    _defaults = {"kernel": None, "module": 0}


class OrtOpSpec(Record):
    """One op of the library: ``domain`` and ``name`` (the node's domain and op_type),
    ``inputs`` and ``outputs`` (counts), ``like`` (per output, the input whose shape and
    dtype it takes), ``variants`` (one :class:`OrtVariant` per dtype), ``cpu`` (the C++
    function the CPU provider calls with the same arguments as the kernel, or None) and
    ``items_per_thread`` (how many items one CUDA thread handles: the grid covers
    ``ceil(n / (256 * items_per_thread))`` blocks of 256, as ``Kernel.config_for`` does)."""

    __slots__ = ("domain", "name", "inputs", "outputs", "like", "variants", "cpu", "items_per_thread")
    _defaults = {"cpu": None, "items_per_thread": 1}


def descriptions(ops: Any = None) -> list[OpDescription]:
    """The descriptions of ``ops``: None (every op registered in this process), one op or a
    list; an op is anything with a ``.name`` (an ``opsmith.custom_op`` op), a name
    (``"mylib::relu"``) or an :class:`~opsmith._opdesc.OpDescription`."""
    if ops is None:
        return all_descriptions()
    if isinstance(ops, (str, OpDescription)) or hasattr(ops, "name"):
        ops = [ops]
    out = []
    for o in ops:
        if isinstance(o, OpDescription):
            out.append(o)
        elif isinstance(o, str):
            out.append(get(o))
        elif isinstance(getattr(o, "name", None), str):
            out.append(get(o.name))
        else:
            raise SpecError(f"ops= takes opsmith.custom_op ops or their names, got {o!r}")
    return out


def _first_dtype(signature: dict, kernel: str) -> str:
    for p in signature["params"]:
        if p["kind"] == "tensor" and len(p["dtypes"]) == 1:
            return p["dtypes"][0]
    raise SpecError(f"kernel {kernel}: its first typed pointer gives the ONNX element type, and it has none")


def _items_per_thread(table: Mapping[str, int] | None, name: str) -> int:
    value = (table or {}).get(name, 1)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 64:
        raise SpecError(f"items_per_thread[{name!r}] = {value!r}: give an int from 1 to 64 (items one "
                        f"CUDA thread handles)")
    return value


def _binding(desc: OpDescription) -> list[str]:
    """The description's binding in the library's words: argument k is input k (every argument
    of an ORT op is a tensor input)."""
    return [f"in{b[3:]}" if b.startswith("arg") else b for b in desc.binding]


def _cuda_variants(desc, where: str, items_per_thread, sources: list, source_index: dict) -> list[OrtVariant]:
    from opsmith._runtime._launch_gen import c_param
    from opsmith._runtime._signature import KernelSignature
    if desc.launch_rule and desc.name not in (items_per_thread or {}):
        raise SpecError(f"{where}: launch= is a Python rule; the ORT op launches elementwise (256 "
                        f"threads per block over output 0's items). Register the op without launch=, "
                        f"or, for a rule that is config_for(n, items_per_thread=K), pass "
                        f"items_per_thread={{{desc.name!r}: K}} to build_library")
    binding = _binding(desc)
    variants = []
    for kern in desc.kernels:
        req = kern.request
        if req is None:
            raise SpecError(f"{where}: kernel {kern.name} was loaded from a binary; the ORT library "
                            f"compiles kernels from their source")
        src_key = (req["source"], tuple(req["include_paths"]), tuple(map(tuple, req["defines"])),
                   tuple(map(tuple, req["headers"])), tuple(req["options"]), req["std"])
        if src_key not in source_index:
            source_index[src_key] = len(sources)
            sources.append({"sources": [req["source"]], "include_paths": list(req["include_paths"]),
                            "defines": {k: v for k, v in req["defines"]} or None,
                            "headers": dict(req["headers"]) or None, "options": list(req["options"]),
                            "std": req["std"]})
        used: set[str] = set()
        sig = KernelSignature.from_json(kern.signature)
        c_params = [c_param(p, used) for p in sig.params]
        variants.append(OrtVariant(dtype=_first_dtype(kern.signature, kern.name), c_params=tuple(c_params),
                                   binding=tuple(binding), kernel=kern.name, module=source_index[src_key]))
    return variants


def _cpu_variants(desc, where: str, cpu: Mapping[str, str], dtypes: Mapping[str, Sequence[str]]) -> list[OrtVariant]:
    from opsmith._runtime._launch_gen import C_TYPES
    if desc.name not in cpu:
        raise SpecError(f"{where}: the op has no opsmith kernel (its CUDA implementation is a Python "
                        f"function), so the library needs a CPU function for it: cpu={{'{desc.name}': "
                        f"'fn'}} with cpu_source=")
    variants = []
    n_in, n_out = len(desc.arg_names), desc.returns
    for dt in dtypes.get(desc.name, ("float32",)):
        ct = C_TYPES.get(dt)
        if ct is None:
            raise SpecError(f"{where}: dtype {dt!r} has no C type; use one of {', '.join(C_TYPES)}")
        params = [f"const {ct} *in{i}" for i in range(n_in)] + [f"{ct} *out{k}" for k in range(n_out)] + \
                 ["long long n"]
        bind = [f"in{i}" for i in range(n_in)] + [f"out{k}" for k in range(n_out)] + ["n"]
        variants.append(OrtVariant(dtype=dt, c_params=tuple(params), binding=tuple(bind)))
    return variants


def ort_specs(ops: Any = None, cpu: Mapping[str, str] | None = None,
              dtypes: Mapping[str, Sequence[str]] | None = None,
              items_per_thread: Mapping[str, int] | None = None) -> tuple[list[OrtOpSpec], list[dict]]:
    """``(specs, cuda_sources)`` for :func:`~opsmith.onnx._library.build_ort_library`.

    ``ops`` as :func:`descriptions` takes them. ``cpu`` maps an op's name (``"mylib::relu"``)
    to the C++ function (in ``cpu_source``) the CPU provider calls with the kernel's own
    arguments. ``dtypes`` gives the dtypes of an op that has no kernel (its CPU function then
    takes ``(const T* in..., T* out..., long long n)``).
    """
    cpu = dict(cpu or {})
    dtypes = dict(dtypes or {})
    descs = descriptions(ops)
    known = {d.name for d in descs}
    for k in list(cpu) + list(dtypes):
        if k not in known:
            raise SpecError(f"cpu=/dtypes= name {k!r}, which is not among the ops exported "
                            f"({', '.join(sorted(known))})")
    specs: list[OrtOpSpec] = []
    sources: list[dict] = []
    source_index: dict = {}
    for d in descs:
        where = f"{d.name} in ONNX Runtime"
        bad = [f"{n}: {t}" for n, t in zip(d.arg_names, d.arg_types) if t != "Tensor"]
        if bad:
            raise SpecError(f"{where}: only tensor arguments become ORT inputs; {', '.join(bad)} would need an "
                            f"ONNX attribute, which opsmith does not generate yet. Make it a tensor or keep this "
                            f"op out of the model")
        for k, o in enumerate(d.outs):
            if not o.like_only():
                raise SpecError(f"{where}: output {k} is allocated {o.describe()}; the ORT op allocates outputs "
                                f"like an input (Out() or Out(like=...)) and nothing else yet")
        if d.kernels:
            variants = _cuda_variants(d, where, items_per_thread, sources, source_index)
        else:
            variants = _cpu_variants(d, where, cpu, dtypes)
        seen_dt = [v.dtype for v in variants]
        if len(set(seen_dt)) != len(seen_dt):
            raise SpecError(f"{where}: two kernels take {seen_dt}; one kernel per dtype")
        specs.append(OrtOpSpec(domain=d.namespace, name=d.op_name, inputs=len(d.arg_names), outputs=d.returns,
                               like=tuple(o.like for o in d.outs), variants=tuple(variants),
                               cpu=cpu.get(d.name), items_per_thread=_items_per_thread(items_per_thread, d.name)))
    return specs, sources


def validate(specs: Sequence[OrtOpSpec]) -> None:
    """Refuse specs the generated library cannot implement, naming the op and the fix."""
    seen = set()
    for s in specs:
        qual = f"{s.domain}.{s.name}"
        if qual in seen:
            raise SpecError(f"op {qual} is listed twice; give each op once")
        seen.add(qual)
        if not re.fullmatch(r"[A-Za-z_][\w.]*", s.domain) or not re.fullmatch(r"[A-Za-z_]\w*", s.name):
            raise SpecError(f"op {qual}: domain and name must be identifiers")
        if not 1 <= s.inputs <= 16 or not 1 <= s.outputs <= 16:
            raise SpecError(f"op {qual}: an ORT op from opsmith takes 1 to 16 tensor inputs and outputs")
        if len(s.like) != s.outputs or any(not 0 <= k < s.inputs for k in s.like):
            raise SpecError(f"op {qual}: every output must be 'like' one of the {s.inputs} inputs")
        if not s.variants:
            raise SpecError(f"op {qual}: no dtype to implement")
        for v in s.variants:
            if v.dtype not in ONNX_DTYPES:
                raise SpecError(f"op {qual}: dtype {v.dtype} has no ONNX element type")
            if len(v.binding) != len(v.c_params):
                raise SpecError(f"op {qual}: {len(v.c_params)} kernel parameters but {len(v.binding)} bindings")
        if s.cpu is None and not any(v.kernel for v in s.variants):
            raise SpecError(f"op {qual} has neither a CUDA kernel nor a CPU function: give it one "
                            f"(cpu={{'{s.domain}::{s.name}': 'my_cpu_fn'}} with cpu_source=...)")
