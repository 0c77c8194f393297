"""What :func:`~opsmith._torch._ops.custom_op` checks of its arguments (name, kernels, out
specs) and the launch configs its generated implementations remember per kernel."""
from __future__ import annotations

from opsmith._errors import SpecError
from opsmith._torch._outspec import Out

__all__ = ["describe_op"]

_MAX_CONFIGS = 4096  # launch configs remembered per kernel (item count x device)


def _new_config(kernel, cfgs: dict, n: int, dev: int, items: int = 1):
    if len(cfgs) >= _MAX_CONFIGS:
        cfgs.clear()
    c = cfgs[n * 256 + dev] = kernel.config_for(n, device=dev, items_per_thread=items)
    return c


def _config_of(kernel, cfgs: dict, rule_result):
    """A launch rule's result as a LaunchConfig, the same object for the same grid and block
    (the launcher validates a config object once)."""
    if rule_result is None:
        return None
    c = cfgs.get(rule_result)
    if c is not None:
        return c
    from opsmith._runtime._launch_config import LaunchConfig
    if isinstance(rule_result, LaunchConfig):
        c = rule_result
    elif isinstance(rule_result, tuple) and len(rule_result) in (2, 3):
        c = LaunchConfig(*rule_result)
    else:
        raise SpecError(f"{kernel.name}: the launch rule returned {rule_result!r}; return a "
                        f"LaunchConfig, (grid, block), (grid, block, shared_mem) or None")
    if len(cfgs) >= _MAX_CONFIGS:
        cfgs.clear()
    try:
        cfgs[rule_result] = c
    except TypeError:  # unhashable grid (a list): build it each time
        pass
    return c


def _first_dtype(kernel):
    import torch
    for p in kernel.params:
        if p.kind == "tensor" and len(p.dtypes) == 1:
            return getattr(torch, p.dtypes[0])
    raise SpecError(f"kernel {kernel.name}: several kernels are told apart by the dtype of their first "
                    f"typed pointer, and this one has none; register one op per kernel")


def _split_name(name: str) -> tuple[str, str]:
    import re
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*::[A-Za-z_]\w*", name):
        raise SpecError(f"op name {name!r} must be 'namespace::name' (identifiers), e.g. 'mylib::relu'")
    ns, opname = name.split("::")
    if ns in ("aten", "prim", "prims", "torch"):
        raise SpecError(f"op name {name!r}: the namespace {ns!r} is torch's own; use your library's name")
    return ns, opname


def _kernel_list(kernel, qualname: str) -> list:
    if kernel is None:
        return []
    ks = list(kernel) if isinstance(kernel, (list, tuple)) else [kernel]
    for k in ks:
        if not hasattr(k, "signature") or not hasattr(k, "launch"):
            raise SpecError(f"{qualname}: kernel= takes opsmith kernels (CudaModule(...).get_kernel(name)), "
                            f"got {k!r}; for a Python or extension function use cuda=")
    return ks


def _out_list(out, s, qualname: str) -> list[Out]:
    if out is None:
        if not s.tensor_returns:
            raise SpecError(f"{qualname} returns {s.text.split('->')[-1].strip()}; opsmith ops return "
                            f"tensors allocated from out= specs")
        return [Out() for _ in range(s.returns)]
    outs = [out] if isinstance(out, Out) else list(out)
    if not all(isinstance(o, Out) for o in outs):
        raise SpecError(f"{qualname}: out= takes opsmith.Out(...) specs, got {out!r}")
    if len(outs) != s.returns:
        raise SpecError(f"{qualname} returns {s.returns} tensor(s) but out= gives {len(outs)} spec(s)")
    if not s.tensor_returns:
        raise SpecError(f"{qualname}: every return of an opsmith op is a Tensor ({s.text})")
    return outs


def describe_op(op):
    """The :class:`~opsmith._opdesc.OpDescription` of a :class:`~opsmith._torch._ops.CustomOp`:
    what the other targets (``opsmith.onnx``) read instead of the torch objects."""
    from opsmith._opdesc import KernelDescription, OpDescription
    from opsmith._torch._outspec import describe_out
    s = op.schema
    kernels, binding = [], []
    for k in getattr(op, "_kernels", None) or ():
        req = getattr(k.module, "_request", None)
        request = None if req is None else {
            "source": req.source,  # a file's own folder first: its "header.cuh" includes resolve there
            "include_paths": ([str(req.source_dir)] if req.source_dir else []) + [str(p) for p in req.include_paths],
            "defines": [list(d) for d in req.defines], "headers": [list(h) for h in req.headers],
            "options": list(req.options), "std": req.std}
        kernels.append(KernelDescription(k.name, k.signature.to_json(), request))
    for e in getattr(op, "_binding", None) or ():
        if e == "_n":
            binding.append("n")
        elif e.startswith("_o"):
            binding.append(f"out{e[2:]}")
        else:
            binding.append(f"arg{s.arg_names.index(e)}")
    return OpDescription(
        name=op.name, schema=s.text, arg_names=tuple(s.arg_names), arg_types=tuple(s.arg_types),
        kwarg_only=tuple(n for n in s.arg_names if n in s.kwarg_only), return_names=tuple(s.return_names),
        outs=tuple(describe_out(o, s.arg_names, s.arg_types) for o in op.outs), kernels=tuple(kernels),
        binding=tuple(binding), launch_rule=getattr(op, "_launch_rule", None) is not None)
