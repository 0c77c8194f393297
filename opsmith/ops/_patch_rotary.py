"""``opsmith.ops.patch``'s rotary embedding: transformers' ``apply_rotary_pos_emb``.

transformers' attention modules (``LlamaAttention``, ``MistralAttention``, ``Qwen2Attention``,
``Gemma*Attention``, ...) rotate their queries and keys with a function of their own Python
module, ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``: ``q * cos + rotate_half(q)
* sin``, eight torch kernels a tensor forward (slices, a negation, a cat, two products, a sum)
and more backward. It is not a module, so ``patch`` replaces that module attribute: for each
module of the tree whose class name ends in ``Attention`` and whose ``forward``'s globals (its
Python module's namespace, where the call looks the name up) hold a plain function of that
name (or, where the ``kernels`` package is installed, as transformers 5 pulls in, the
``nn.Module`` its ``use_kernel_forward_from_hub`` makes of that function), a :class:`RotaryPosEmb`
that runs :func:`opsmith.ops.rotary_embedding_qk` on ``q`` and ``k``, one launch for both
(full-width neox tables: exactly the formula, whatever the tables hold; a transposed ``q`` is
read in place). It is checked first: both run on a small random ``q``, ``k``
and tables built as transformers builds them, and must agree; a function that does not (another
layout, another signature) is left alone and reported.

The replacement is process-wide: every model of that Python module runs it, as with Liger-Kernel's
patching; ``RotaryPosEmb.restore()`` puts the original back. Calls it does not cover (tables
narrower than the head dim, as partial rotary; mixed dtypes or devices; tables that need a
gradient; other arguments) run the original, as do calls while ``torch.compile`` traces where
``under_compile="inductor"``.
"""
from __future__ import annotations

import functools
import inspect
import sys
import types

import torch

from opsmith.ops import _modules

__all__ = ["NAME", "RotaryPosEmb", "candidates"]

NAME = "apply_rotary_pos_emb"
# the arguments a call may pass besides q, k, cos, sin: transformers' unsqueeze_dim, and
# position_ids (accepted and unused by transformers since 4.36)
_KNOWN = ("unsqueeze_dim", "position_ids")


class RotaryPosEmb:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` on opsmith's
    rotary kernel; ``original`` is the replaced function, ``namespace`` the globals of the
    Python module it was taken from."""

    inductor = False

    def __init__(self, original, namespace: dict) -> None:
        fn = _function_of(original)
        if fn is None:
            raise TypeError(f"{NAME} is a {type(original).__name__}, not a function")
        functools.update_wrapper(self, fn)
        self.original, self.namespace = original, namespace
        self._sig = inspect.signature(fn)
        p = self._sig.parameters.get("unsqueeze_dim")
        self._unsqueeze = p.default if p is not None and isinstance(p.default, int) else 1

    def __call__(self, q, k, cos, sin, *args, **kwargs):
        unsqueeze = self._unsqueeze
        if args or kwargs:
            try:
                bound = self._sig.bind(q, k, cos, sin, *args, **kwargs).arguments
            except TypeError:
                return self.original(q, k, cos, sin, *args, **kwargs)  # its own error
            extra = set(bound) - {*list(self._sig.parameters)[:4], *_KNOWN}
            unsqueeze = bound.get("unsqueeze_dim", unsqueeze)
            if extra or not isinstance(unsqueeze, int):
                return self.original(q, k, cos, sin, *args, **kwargs)
        if (self.inductor and _modules.compiling()) or not _covers(q, k, cos, sin):
            return self.original(q, k, cos, sin, *args, **kwargs)
        from opsmith.ops import _public
        cos, sin = cos.unsqueeze(unsqueeze), sin.unsqueeze(unsqueeze)
        return _public.rotary_embedding_qk(q, k, cos, sin)  # both in one launch

    def restore(self) -> bool:
        """Put the original function back in its module (False where something else replaced
        this one since)."""
        if self.namespace.get(NAME) is not self:
            return False
        self.namespace[NAME] = self.original
        return True

    def install(self) -> None:
        """Put this one in the original's place."""
        self.namespace[NAME] = self

    def __repr__(self) -> str:
        return f"RotaryPosEmb({self.namespace.get('__name__')}.{NAME})"


def _function_of(original):
    """The Python function behind ``original``: itself where it is one; for the ``nn.Module`` that the
    ``kernels`` package's ``use_kernel_forward_from_hub`` makes of a function (transformers 5 decorates
    ``apply_rotary_pos_emb`` so where ``kernels`` is installed; its ``forward`` calls the function it
    closes over, unless ``kernelize`` chose a hub kernel), that function; else None."""
    if isinstance(original, types.FunctionType):
        return original
    if not isinstance(original, torch.nn.Module):
        return None
    try:
        closed = inspect.getclosurevars(type(original).forward).nonlocals
    except (TypeError, AttributeError):
        return None
    fns = [f for f in closed.values() if isinstance(f, types.FunctionType) and f.__name__ == NAME]
    return fns[0] if len(fns) == 1 else None


def _covers(q, k, cos, sin) -> bool:
    """The calls the kernel computes exactly as the formula: full-width tables, one dtype and
    device, no gradient wanted for the tables."""
    ts = (q, k, cos, sin)
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return False
    d = q.shape[-1] if q.dim() else 0
    return (d > 0 and d % 2 == 0 and k.shape[-1] == d and cos.shape[-1] == d and cos.shape == sin.shape
            and 2 <= q.dim() <= 5 and 2 <= k.dim() <= 5
            and len({t.dtype for t in ts}) == 1 and len({t.device for t in ts}) == 1
            and q.dtype in _modules.FLOATS
            and not (cos.requires_grad or sin.requires_grad))


def _mismatch(original, new: RotaryPosEmb) -> str | None:
    """Why ``new`` cannot stand in for ``original``: both run on a small random input (q and k of
    [batch, heads, seq, head_dim], k with fewer heads as in grouped-query attention; tables
    [batch, seq, head_dim] of duplicated halves, as transformers builds them)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    ang = torch.randn(2, 5, 4, generator=g)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    with torch.no_grad():
        try:
            want = original(q, k, cos, sin)
        except Exception as exc:  # noqa: BLE001  (only its name looked like transformers': leave it, say why)
            return f"it raised {type(exc).__name__} on a random q, k, cos, sin"
        got = new(q, k, cos, sin)
    if not (isinstance(want, tuple) and len(want) == 2 and all(isinstance(w, torch.Tensor) for w in want)):
        return "it does not return (q, k)"
    ok = all(w.shape == o.shape and torch.allclose(o, w, rtol=1e-5, atol=1e-6) for w, o in zip(want, got))
    return None if ok else "its output differs from opsmith's rotary_embedding on a random input"


def _namespace(cls) -> dict | None:
    """The globals ``cls.forward`` looks names up in: its innermost function's (decorators such as
    transformers' ``deprecate_kwarg`` wrap it), else the class's own Python module's."""
    try:
        fn = inspect.unwrap(cls.forward)
    except (AttributeError, ValueError):
        fn = None
    namespace = getattr(fn, "__globals__", None)
    if isinstance(namespace, dict) and NAME in namespace:
        return namespace
    module = sys.modules.get(cls.__module__)
    return vars(module) if module is not None else None


def candidates(model: torch.nn.Module):
    """``(qualified name, original, replacement or None, why not)`` for each Python module
    whose ``apply_rotary_pos_emb`` an attention module of ``model`` calls."""
    seen: set[int] = set()
    for m in model.modules():
        cls = type(m)
        if not cls.__name__.endswith("Attention"):
            continue
        namespace = _namespace(cls)
        if namespace is None or id(namespace) in seen:
            continue
        seen.add(id(namespace))
        original = namespace.get(NAME)
        if original is None or isinstance(original, RotaryPosEmb):  # none, or replaced already
            continue
        qualname = f"{namespace.get('__name__', cls.__module__)}.{NAME}"
        if _function_of(original) is None:
            yield qualname, original, None, f"it is an object of class {type(original).__name__}, not a function"
            continue
        new = RotaryPosEmb(original, namespace)
        why = _mismatch(original, new)
        yield qualname, original, (new if why is None else None), why
