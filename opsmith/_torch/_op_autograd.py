"""The Autograd kernel of a :class:`~opsmith._torch._ops.CustomOp` (``register_autograd``)."""
from __future__ import annotations

from typing import Any

from opsmith._errors import OpsmithError, SpecError

__all__ = ["install_autograd"]


def install_autograd(self, backward, setup_context, save) -> None:
    """Register op ``self``'s Autograd kernel: a call that needs no gradient goes straight to the
    device implementation (``self._fast``); one that does goes through a generated
    ``torch.autograd.Function`` whose forward redispatches below Autograd."""
    import torch
    from torch import _C
    s = self.schema
    overload = self.default
    pos = [n for n in s.arg_names if n not in s.kwarg_only]
    kwo = [n for n in s.arg_names if n in s.kwarg_only]
    n_in = len(s.arg_names)
    after = _C._after_autograd_keyset
    below = _C._AutoDispatchBelowAutograd
    if save is not None:
        names = {**{n: ("in", i) for i, n in enumerate(s.arg_names)},
                 **{n: ("out", k) for k, n in enumerate(s.return_names)},
                 **{f"out{k}": ("out", k) for k in range(s.returns)}}
        for n in save:
            if n not in names:
                raise SpecError(f"{self.name}: register_autograd(save=...) names {n!r}, which is neither an "
                                f"argument ({', '.join(s.arg_names)}) nor an output "
                                f"({', '.join(s.return_names)})")
        where = [names[n] for n in save]
        single = s.single

        def setup_context(ctx, inputs, output):
            outs = (output,) if single else output
            ctx.save_for_backward(*[inputs[i] if w == "in" else outs[i] for w, i in where])

        user_backward = backward

        def backward(ctx, *grads):
            return user_backward(*grads, *ctx.saved_tensors)

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
            raise OpsmithError(f"{self.name}: the backward returned {len(result)} gradients for "
                               f"{n_in} inputs; return one per input (None where there is none)")
        return (None, *result, *([None] * (n_in - len(result))))

    fn_cls = type(f"{self.name.replace('::', '_')}_autograd", (torch.autograd.Function,),
                  {"forward": staticmethod(forward), "backward": staticmethod(backward_impl)})
    ns: dict[str, Any] = {"_grad_on": _C.is_grad_enabled, "_any_rg": _C._any_requires_grad,
                          "_apply": fn_cls.apply, "_FAST": self._fast, "_below": below,
                          "_AFTER": after, "_redispatch": overload.redispatch}
    params = self._params(ns)
    tensors = ", ".join(n for n, t in zip(s.arg_names, s.arg_types) if "Tensor" in t)
    call = ", ".join([*pos, *(f"{n}={n}" for n in kwo)])
    code = "\n".join([
        f"def f(_ks, {params}):",
        f"    if _grad_on() and _any_rg({tensors}):",
        f"        return _apply(_ks, {', '.join(s.arg_names)})",
        "    _impl = _FAST.get(_ks.raw_repr())",
        "    if _impl is not None:",
        f"        return _impl({call})",
        "    with _below():",
        f"        return _redispatch(_ks & _AFTER, {call})"])
    exec(compile(code, f"<opsmith op {self.name} autograd>", "exec"), ns)
    self._lib.impl(self.name.split("::")[1], ns["f"], "Autograd", with_keyset=True)
