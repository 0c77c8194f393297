"""The gated activations as torch operators: ``act(gate) * up``, the middle of a SwiGLU / GeGLU MLP.

``silu_and_mul``/``gelu_and_mul`` take ``x = [gate | up]`` on its last dim (``2 * d``: gate and
up projections that are one matmul) and return ``d``; ``silu_mul``/``gelu_mul`` take ``gate``
and ``up`` as two tensors of one shape (``gate_proj(x)`` and ``up_proj(x)``, or any views) and
their backwards return ``(d_gate, d_up)``.

=====================  =====================================================================
``silu_and_mul``       ``(Tensor x) -> Tensor``; ``silu_and_mul_backward(Tensor grad, Tensor x)``
``gelu_and_mul``       ``(Tensor x, str approximate="none") -> Tensor``; ``gelu_and_mul_backward``
``silu_mul``           ``(Tensor gate, Tensor up) -> Tensor``; ``silu_mul_backward(Tensor grad,
                       Tensor gate, Tensor up) -> (Tensor, Tensor)``
``gelu_mul``           ``(Tensor gate, Tensor up, str approximate="none") -> Tensor``;
                       ``gelu_mul_backward``
=====================  =====================================================================

The CUDA implementations are Python (:func:`opsmith.ops._functional.gated_fwd`,
:func:`~opsmith.ops._functional.gated_mul_fwd`, one set of kernels in ``kernels/gated.cu``) on
every machine: the C++ library serves the other ops only.
"""
from __future__ import annotations

from opsmith._errors import SpecError
from opsmith.ops import _functional as fn

__all__ = ["define_all", "gelu_kind"]


def gelu_kind(approximate: str, op: str = "gelu_and_mul") -> str:
    """``"gelu"`` or ``"gelu_tanh"`` for torch's ``approximate`` argument."""
    if approximate == "none":
        return "gelu"
    if approximate == "tanh":
        return "gelu_tanh"
    raise SpecError(f"opsmith.ops.{op}: approximate must be 'none' or 'tanh', got {approximate!r}")


def _split(x, op: str):
    _, d = fn._gated_rows(x, op)  # the same check as on CUDA: the last dim is even
    return x[..., :d], x[..., d:]


def _act(kind: str, gate):
    import torch.nn.functional as F
    return F.silu(gate) if kind == "silu" else F.gelu(gate, approximate="tanh" if kind == "gelu_tanh" else "none")


def _act_backward(kind: str, grad, gate):
    import torch
    aten = torch.ops.aten
    if kind == "silu":
        return aten.silu_backward(grad, gate)
    return aten.gelu_backward(grad, gate, approximate="tanh" if kind == "gelu_tanh" else "none")


def _cpu_fwd(kind: str, x):
    gate, up = _split(x, fn.GATED_KERNELS[kind])
    return _act(kind, gate) * up


def _cpu_bwd(kind: str, grad, x):
    import torch
    gate, up = _split(x, fn.GATED_KERNELS[kind])
    return torch.cat([_act_backward(kind, grad * up, gate), grad * _act(kind, gate)], dim=-1)


def _cpu_mul_fwd(kind: str, gate, up):
    fn._gated_pair(gate, up, fn.GATED_PAIR_OPS[kind])  # the same check as on CUDA
    return _act(kind, gate) * up


def _cpu_mul_bwd(kind: str, grad, gate, up):
    fn._gated_pair(gate, up, fn.GATED_PAIR_OPS[kind])
    return _act_backward(kind, grad * up, gate), grad * _act(kind, gate)


def _fake_mul_fwd(gate, up, *args):
    return gate.new_empty(gate.shape)


def _fake_mul_bwd(grad, gate, up, *args):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _fake_fwd(x, *args):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _fake_bwd(grad, x, *args):
    return x.new_empty(x.shape)


def define_all(define) -> list:
    """Define the eight operators through ``define(name, schema, cuda, cpu, fake)`` (as
    ``_register`` defines the others) with their autograd; returns the ops whose CUDA
    implementation must be registered even where the C++ library serves."""
    silu = define("silu_and_mul", "(Tensor x) -> Tensor", lambda x: fn.gated_fwd("silu", x),
                  lambda x: _cpu_fwd("silu", x), _fake_fwd)
    silu_b = define("silu_and_mul_backward", "(Tensor grad, Tensor x) -> Tensor",
                    lambda g, x: fn.gated_bwd("silu", g, x), lambda g, x: _cpu_bwd("silu", g, x), _fake_bwd)
    silu.register_autograd(silu_b.default, save=("x",))

    gelu = define("gelu_and_mul", '(Tensor x, str approximate="none") -> Tensor',
                  lambda x, approximate="none": fn.gated_fwd(gelu_kind(approximate), x),
                  lambda x, approximate="none": _cpu_fwd(gelu_kind(approximate), x), _fake_fwd)
    gelu_b = define("gelu_and_mul_backward", '(Tensor grad, Tensor x, str approximate="none") -> Tensor',
                    lambda g, x, approximate="none": fn.gated_bwd(gelu_kind(approximate), g, x),
                    lambda g, x, approximate="none": _cpu_bwd(gelu_kind(approximate), g, x), _fake_bwd)
    gelu.register_autograd(gelu_b, save=("x", "approximate"))
    return [silu, silu_b, gelu, gelu_b, *_define_pairs(define)]


def _define_pairs(define) -> list:
    """``silu_mul``, ``gelu_mul`` and their backwards: gate and up as two tensors."""
    silu = define("silu_mul", "(Tensor gate, Tensor up) -> Tensor", lambda a, b: fn.gated_mul_fwd("silu", a, b),
                  lambda a, b: _cpu_mul_fwd("silu", a, b), _fake_mul_fwd)
    silu_b = define("silu_mul_backward", "(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)",
                    lambda g, a, b: fn.gated_mul_bwd("silu", g, a, b), lambda g, a, b: _cpu_mul_bwd("silu", g, a, b),
                    _fake_mul_bwd)
    silu.register_autograd(silu_b.default, save=("gate", "up"))

    gelu = define("gelu_mul", '(Tensor gate, Tensor up, str approximate="none") -> Tensor',
                  lambda a, b, approximate="none": fn.gated_mul_fwd(gelu_kind(approximate, "gelu_mul"), a, b),
                  lambda a, b, approximate="none": _cpu_mul_fwd(gelu_kind(approximate, "gelu_mul"), a, b),
                  _fake_mul_fwd)
    gelu_b = define("gelu_mul_backward",
                    '(Tensor grad, Tensor gate, Tensor up, str approximate="none") -> (Tensor, Tensor)',
                    lambda g, a, b, approximate="none": fn.gated_mul_bwd(gelu_kind(approximate, "gelu_mul"), g, a, b),
                    lambda g, a, b, approximate="none": _cpu_mul_bwd(gelu_kind(approximate, "gelu_mul"), g, a, b),
                    _fake_mul_bwd)
    gelu.register_autograd(gelu_b, save=("gate", "up", "approximate"), grads_for=("gate", "up"))
    return [silu, silu_b, gelu, gelu_b]
