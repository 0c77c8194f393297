"""The Autograd kernel of a :class:`~opsmith._torch._ops.CustomOp` (``register_autograd``).

Two kernels, one behaviour:

- **native** (C++, :mod:`opsmith._torch._autograd_native`): for ops whose backward is itself an
  op (``register_autograd(backward_op, save=...)`` or ``args=...``) and for
  :meth:`~opsmith._torch._ops.CustomOp.not_differentiable`. A call that needs no gradient
  redispatches straight to the device kernel; one that does records a C++ backward node that
  calls the backward op through the dispatcher. No Python on either path.
- **Python**: for Python backward functions, torch's ``setup_context`` form, and torch builds
  where the native library cannot be built. A call that needs no gradient goes straight to the
  device implementation (``op._fast``); one that does goes through a generated
  ``torch.autograd.Function`` whose forward redispatches below Autograd.

What the backward receives is a :class:`Plan`, read from the short form's names.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple, Sequence

from opsmith._errors import OpsmithError, SpecError

__all__ = ["install_autograd", "install_refusal", "Plan", "plan_of", "backward_name"]

A_TENSOR, A_OPTIONAL_TENSOR, A_OTHER = 0, 1, 2
B_GRAD, B_INPUT, B_OUTPUT, B_NEEDS = 0, 1, 2, 3
_NEEDS = re.compile(r"^needs_grad\((\w+)\)$")
_GRAD = re.compile(r"^grad(\d*)$")


class Plan(NamedTuple):  # a NamedTuple, not a frozen dataclass: ~1 ms less at import, on a package's path
    """What an op's backward receives and returns.

    ``bargs``: per argument of the backward, ``(B_GRAD, k)`` the gradient of output k,
    ``(B_INPUT, i)`` op argument i, ``(B_OUTPUT, k)`` output k, ``(B_NEEDS, i)`` whether op
    argument i needs a gradient. ``grads_for[j]``: the op argument that result j of the
    backward is the gradient of. ``backward``: the backward op's ``"ns::name"`` (None for a
    Python function); ``refuse``: the message of an op that is not differentiable.
    """

    arg_kind: tuple[int, ...]
    n_outs: int
    bargs: tuple[tuple[int, int], ...]
    grads_for: tuple[int, ...]
    backward: str | None = None
    refuse: str | None = None


def _arg_kind(t: str) -> int:
    if t == "Tensor":
        return A_TENSOR
    if t in ("Tensor?", "Optional[Tensor]"):
        return A_OPTIONAL_TENSOR
    return A_OTHER


def plan_of(op, save: Sequence[str] | None, args: Sequence[str] | None,
            grads_for: Sequence[str] | None) -> Plan:
    """The :class:`Plan` of ``op`` from the short form's names (``save=`` or ``args=``)."""
    s = op.schema
    inputs = {n: i for i, n in enumerate(s.arg_names)}
    outputs = {**{f"out{k}": k for k in range(s.returns)}, **{n: k for k, n in enumerate(s.return_names) if n}}

    def item(name: str, allow: str) -> tuple[int, int]:
        if name in inputs:
            return (B_INPUT, inputs[name])
        if name in outputs:
            return (B_OUTPUT, outputs[name])
        if "g" in allow:
            m = _GRAD.match(name)
            if m and int(m.group(1) or 0) < s.returns:
                return (B_GRAD, int(m.group(1) or 0))
            m = _NEEDS.match(name)
            if m and m.group(1) in inputs:
                return (B_NEEDS, inputs[m.group(1)])
        extra = ", grad/grad0.., needs_grad(<argument>)" if "g" in allow else ""
        raise SpecError(f"{op.name}: register_autograd names {name!r}, which is neither an argument "
                        f"({', '.join(s.arg_names)}) nor an output ({', '.join(outputs)}){extra}")

    if args is not None:
        bargs = tuple(item(n, "g") for n in args)
    else:
        bargs = tuple((B_GRAD, k) for k in range(s.returns)) + tuple(item(n, "") for n in (save or ()))
    if grads_for is None:
        gf = tuple(range(len(s.arg_names)))
    else:
        for n in grads_for:
            if n not in inputs:
                raise SpecError(f"{op.name}: register_autograd(grads_for=...) names {n!r}, which is not an "
                                f"argument ({', '.join(s.arg_names)})")
        gf = tuple(inputs[n] for n in grads_for)
    return Plan(tuple(_arg_kind(t) for t in s.arg_types), s.returns, bargs, gf)


def backward_name(backward) -> str | None:
    """``"ns::name"`` when ``backward`` is the default overload of an op (then the native kernel
    can call it), else None."""
    if not hasattr(backward, "_overloadname"):
        backward = getattr(backward, "default", backward)  # a CustomOp or an OpOverloadPacket
    schema = getattr(backward, "_schema", None)
    if schema is None or getattr(backward, "_overloadname", None) != "default":
        return None
    return schema.name


def _native(op, plan: Plan) -> bool:
    """Register ``plan`` natively when it can be; False leaves it to the Python kernel."""
    from opsmith._torch import _autograd_native
    if any("Tensor" in t and _arg_kind(t) == A_OTHER for t in op.schema.arg_types):
        return False  # Tensor[] arguments: the Python kernel
    if not _autograd_native.usable():
        return False
    _autograd_native.register(op.name, plan)
    return True


def install_refusal(op, message: str) -> None:
    """Make ``op`` refuse differentiation: its backward raises ``message``."""
    s = op.schema
    plan = Plan(tuple(_arg_kind(t) for t in s.arg_types), s.returns, (), (), refuse=message)
    op.autograd = "native" if _native(op, plan) else "python"
    if op.autograd == "python":

        def backward(ctx, *grads):
            raise NotImplementedError(message)

        _install_python(op, backward, lambda ctx, inputs, output: None)


def install_autograd(op, backward, setup_context, save, args=None, grads_for=None) -> None:
    """Register op ``op``'s Autograd kernel (see the module's docstring)."""
    if setup_context is not None:
        op.autograd = "python"
        _install_python(op, backward, setup_context)
        return
    plan = plan_of(op, save, args, grads_for)
    name = backward_name(backward)
    if name is not None:  # an op: its schema says what it returns, checked now rather than at backward time
        overload = backward if hasattr(backward, "_overloadname") else backward.default
        rets = [str(r.type) for r in overload._schema.returns]
        if len(rets) > len(plan.grads_for) or any(r != "Tensor" for r in rets):
            raise SpecError(f"{op.name}: its backward {name} returns ({', '.join(rets)}): the backward returns "
                            f"{len(rets)} gradients for {len(plan.grads_for)} inputs; return one Tensor per input "
                            f"({', '.join(op.schema.arg_names[i] for i in plan.grads_for)})")
    if name is not None and _native(op, plan._replace(backward=name)):
        op.autograd = "native"
        return
    op.autograd = "python"
    setup, bw = _python_plan(op, plan, backward)
    _install_python(op, bw, setup)


def _python_plan(op, plan: Plan, backward):
    """``setup_context``/``backward`` functions that do what the native kernel does for ``plan``."""
    import torch
    kept = [(k, i) for k, i in plan.bargs if k in (B_INPUT, B_OUTPUT)]
    single = op.schema.single
    n_in = len(plan.arg_kind)

    used = {i for k, i in plan.bargs if k == B_GRAD}

    def setup_context(ctx, inputs, output):
        outs = (output,) if single else output
        unused = [o for k, o in enumerate(outs) if k not in used and isinstance(o, torch.Tensor)]
        if unused:  # as the native kernel: an output whose gradient the backward does not take
            ctx.mark_non_differentiable(*unused)
        values = [inputs[i] if k == B_INPUT else outs[i] for k, i in kept]
        is_t = [isinstance(v, torch.Tensor) for v in values]
        ctx.save_for_backward(*[v for v, t in zip(values, is_t) if t])
        ctx.osm_values = [None if t else v for v, t in zip(values, is_t)]
        ctx.osm_is_tensor = is_t

    def run_backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        values = [next(saved) if t else v for v, t in zip(ctx.osm_values, ctx.osm_is_tensor)]
        vals = iter(values)
        call = []
        for k, i in plan.bargs:
            if k == B_GRAD:
                call.append(grads[i])
            elif k == B_NEEDS:
                call.append(bool(ctx.needs_input_grad[1 + i]))  # forward's first input is the key set
            else:
                call.append(next(vals))
        result = backward(*call)
        if not isinstance(result, (tuple, list)):
            result = (result,)
        if len(result) > len(plan.grads_for):
            raise OpsmithError(f"{op.name}: the backward returned {len(result)} gradients for "
                               f"{len(plan.grads_for)} inputs; return one per input (None where there is none)")
        out: list[Any] = [None] * n_in
        for j, r in enumerate(result):
            i = plan.grads_for[j]
            if ctx.needs_input_grad[1 + i]:
                out[i] = r
        return tuple(out)

    return setup_context, run_backward


def _any_rg(*args: Any) -> bool:
    """torch._C._any_requires_grad where torch (< 2.5) lacks it: a tensor argument requires grad."""
    return any(getattr(a, "requires_grad", False) for a in args)


def _install_python(op, backward, setup_context) -> None:
    import torch
    from torch import _C
    s = op.schema
    overload = op.default
    pos = [n for n in s.arg_names if n not in s.kwarg_only]
    kwo = [n for n in s.arg_names if n in s.kwarg_only]
    n_in = len(s.arg_names)
    after = _C._after_autograd_keyset
    below = _C._AutoDispatchBelowAutograd

    def forward(ctx, keyset, *args):
        with below():
            result = overload.redispatch(keyset & after, *args[:len(pos)],
                                         **dict(zip(kwo, args[len(pos):])))
        setup_context(ctx, args, result)
        return result

    def backward_impl(ctx, *grads):
        result = backward(ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        if len(result) > n_in:
            raise OpsmithError(f"{op.name}: the backward returned {len(result)} gradients for "
                               f"{n_in} inputs; return one per input (None where there is none)")
        return (None, *result, *([None] * (n_in - len(result))))

    fn_cls = type(f"{op.name.replace('::', '_')}_autograd", (torch.autograd.Function,),
                  {"forward": staticmethod(forward), "backward": staticmethod(backward_impl)})
    ns: dict[str, Any] = {"_grad_on": _C.is_grad_enabled, "_any_rg": getattr(_C, "_any_requires_grad", _any_rg),
                          "_apply": fn_cls.apply, "_FAST": op._fast, "_below": below,
                          "_AFTER": after, "_redispatch": overload.redispatch}
    params = op._params(ns)
    tensors = ", ".join(n for n, t in zip(s.arg_names, s.arg_types) if "Tensor" in t)
    call = ", ".join([*pos, *(f"{n}={n}" for n in kwo)])
    code = "\n".join([
        f"def f(_ks, {params}):",
        f"    if _grad_on() and _any_rg({tensors}):",
        f"        return _apply(_ks, {', '.join(s.arg_names)})",
        *(["    _impl = _FAST.get(_ks.raw_repr())",  # torch >= 2.5: DispatchKeySet.raw_repr
           "    if _impl is not None:",
           f"        return _impl({call})"] if hasattr(_C.DispatchKeySet, "raw_repr") else []),
        "    with _below():",
        f"        return _redispatch(_ks & _AFTER, {call})"])
    exec(compile(code, f"<opsmith op {op.name} autograd>", "exec"), ns)
    op._lib.impl(op.name.split("::")[1], ns["f"], "Autograd", with_keyset=True)
