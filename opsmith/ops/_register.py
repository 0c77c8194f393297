"""The ops as torch operators ``torch.ops.opsmith.*`` through :func:`opsmith.custom_op`.

Each op and its backward is an operator with a schema, a CUDA implementation (the kernels,
``_functional``), a CPU implementation (torch's own code, or the formula in float32/64), a
fake kernel (contiguous outputs of the real shapes and dtypes: ``torch.compile`` traces the
ops without a graph break) and an autograd formula that calls the backward operator:

=====================  =====================================================================
``relu``               ``(Tensor x) -> Tensor``; ``relu_backward(Tensor grad, Tensor x)``
``gelu``               ``(Tensor x, str approximate="none") -> Tensor``; ``gelu_backward``
``silu``               ``(Tensor x) -> Tensor``; ``silu_backward``
``softmax``            ``(Tensor x, int dim=-1) -> Tensor``; ``softmax_backward(grad, y, dim)``
``layer_norm``         ``(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias,
                       float eps) -> (Tensor y, Tensor mean, Tensor rstd)``; ``layer_norm_backward``
                       (optional tensors come last in the backward schemas)
``rms_norm``           ``(Tensor x, int[] normalized_shape, Tensor? weight, float? eps)
                       -> (Tensor y, Tensor rstd)``; ``rms_norm_backward``
``silu_and_mul``       ``(Tensor x) -> Tensor`` over ``x = [gate | up]``; ``gelu_and_mul`` (``str
                       approximate``); their backwards (:mod:`opsmith.ops._gated`)
``silu_mul``           ``(Tensor gate, Tensor up) -> Tensor``: gate and up as two tensors; ``gelu_mul``;
                       their backwards return ``(d_gate, d_up)`` (:mod:`opsmith.ops._gated`)
``rotary_embedding``   rotary position embedding, neox or interleaved, cos/sin given or indexed by
                       positions; ``rotary_embedding_qk``: q and k in one launch (:mod:`opsmith.ops._rotary`);
                       ``rotary_embedding_``, ``rotary_embedding_qk_`` in place (``_rotary_inplace``)
``add_rms_norm``       ``x + residual`` then RMS norm, one kernel: ``(y, residual_out, rstd)``
                       (:mod:`opsmith.ops._fused`); ``add_layer_norm``: ``(y, residual_out, mean,
                       rstd)``, an add and layer_norm's kernels
``cross_entropy``      cross-entropy over a vocabulary, ``ignore_index``, reductions, label smoothing,
                       z-loss: ``(loss, lse, count)``; its backward (:mod:`opsmith.ops._cross_entropy`)
``layer_norm_y``       ``layer_norm``'s first output alone; ``rms_norm_y`` likewise (C++ composites
                       over the full ops, defined where the C++ kernels serve; the public
                       functions call them)
=====================  =====================================================================

``mean`` and ``rstd`` hold one value per row (float32; float64 for float64 inputs).
Registration happens once, on the first call of an opsmith.ops function. On a machine with a
CUDA device the CUDA kernels are C++ (:mod:`opsmith.ops._native`: no Python on the call);
where that library cannot be built, the Python implementations of ``_functional``.
"""
from __future__ import annotations

import math
import threading

from opsmith._errors import SpecError
from opsmith.ops import _functional as fn
from opsmith.ops import _norms

__all__ = ["CROSS_ENTROPY_NAMES", "FUSED_NAMES", "GATED_NAMES", "OP_NAMES", "ROTARY_NAMES", "ops"]

OP_NAMES = ("relu", "relu_backward", "gelu", "gelu_backward", "silu", "silu_backward", "softmax",
            "softmax_backward", "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward")
# the gated activations (opsmith.ops._gated): Python CUDA implementations on every machine
GATED_NAMES = ("silu_and_mul", "silu_and_mul_backward", "gelu_and_mul", "gelu_and_mul_backward", "silu_mul",
               "silu_mul_backward", "gelu_mul", "gelu_mul_backward")
FUSED_NAMES = ("add_rms_norm", "add_rms_norm_backward",  # opsmith.ops._fused: Python CUDA code too
               "add_layer_norm", "add_layer_norm_backward")
ROTARY_NAMES = ("rotary_embedding", "rotary_embedding_backward",  # opsmith.ops._rotary: likewise
                "rotary_embedding_qk", "rotary_embedding_qk_backward")
CROSS_ENTROPY_NAMES = ("cross_entropy", "cross_entropy_backward")  # opsmith.ops._cross_entropy: likewise

_lock = threading.Lock()
_done = False
_native_registered = False  # the C++ CUDA kernels (and layer_norm_y / rms_norm_y) serve the ops
_first_lib: list = []       # the Library that defines layer_norm_y / rms_norm_y, kept alive


def ops():
    """``torch.ops.opsmith``, with every op registered."""
    import torch
    global _done
    if not _done:
        with _lock:
            if not _done:
                _register_all()
                _done = True
    return torch.ops.opsmith


def native_registered() -> bool:
    """True once the ops run their C++ CUDA kernels, with ``layer_norm_y``/``rms_norm_y`` defined."""
    ops()
    return _native_registered


def _define_first_outputs() -> None:
    """``layer_norm_y``/``rms_norm_y``: the first output of layer_norm/rms_norm alone (C++,
    CompositeImplicitAutograd over the full op): the public functions return one tensor without
    making Python objects of the statistics."""
    import torch
    lib = torch.library.Library("opsmith", "FRAGMENT")
    lib.define("layer_norm_y(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
               "float eps=1e-05) -> Tensor")
    lib.define("rms_norm_y(Tensor x, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor")
    _first_lib.append(lib)


def _stats(x):
    import torch
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rows(x, shape) -> int:
    return math.prod(x.shape[: x.dim() - len(shape)])


def _gelu_op(approximate: str) -> str:
    op = fn.GELU_KERNELS.get(approximate)
    if op is None:
        raise SpecError(f"opsmith.ops.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return op


# -- CPU: torch's own code, or the backward formula in the accumulation type ------------------------------
def _softmax_cpu(x, dim=-1):
    import torch
    return torch.softmax(x, dim)


def _softmax_backward_cpu(grad, y, dim):
    import torch
    return torch._softmax_backward_data(grad, y, dim, y.dtype)


def _layer_norm_cpu(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    import torch
    y, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
    return y, mean.reshape(-1).to(_stats(x)).clone(), rstd.reshape(-1).to(_stats(x)).clone()


def _layer_norm_backward_cpu(grad, x, normalized_shape, mean, rstd, want_w, want_b, weight=None):
    cols = math.prod(normalized_shape)
    a = _stats(x)
    xs, g = x.reshape(-1, cols).to(a), grad.reshape(-1, cols).to(a)
    xhat = (xs - mean[:, None]) * rstd[:, None]
    gw = g * weight.reshape(-1).to(a) if weight is not None else g
    dx = rstd[:, None] * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
    dw = (g * xhat).sum(0).reshape(normalized_shape).to(x.dtype) if want_w else x.new_empty(0)
    db = g.sum(0).reshape(normalized_shape).to(x.dtype) if want_b else x.new_empty(0)
    return dx.to(x.dtype).reshape(x.shape), dw, db


def _rms_norm_cpu(x, normalized_shape, weight=None, eps=None):
    import torch
    import torch.nn.functional as F
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    rstd = torch.rsqrt(x.to(_stats(x)).pow(2).mean(dims) + eps).reshape(-1)
    return F.rms_norm(x, normalized_shape, weight, eps), rstd


def _rms_norm_backward_cpu(grad, x, normalized_shape, rstd, want_w, weight=None):
    cols = math.prod(normalized_shape)
    a = _stats(x)
    xs, g = x.reshape(-1, cols).to(a), grad.reshape(-1, cols).to(a)
    gw = g * weight.reshape(-1).to(a) if weight is not None else g
    r = rstd[:, None]
    dx = r * (gw - xs * r * r * (gw * xs).mean(-1, keepdim=True))
    dw = (g * xs * r).sum(0).reshape(normalized_shape).to(x.dtype) if want_w else x.new_empty(0)
    return dx.to(x.dtype).reshape(x.shape), dw


# -- fake kernels: what the CUDA implementations return, without data ----------------------------------------
def _like(x):
    return x.new_empty(x.shape)


def _layer_norm_fake(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    rows = _rows(x, normalized_shape)
    return _like(x), x.new_empty((rows,), dtype=_stats(x)), x.new_empty((rows,), dtype=_stats(x))


def _layer_norm_backward_fake(grad, x, normalized_shape, mean, rstd, want_w, want_b, weight=None):
    shape = tuple(normalized_shape)
    return _like(x), x.new_empty(shape if want_w else (0,)), x.new_empty(shape if want_b else (0,))


def _rms_norm_fake(x, normalized_shape, weight=None, eps=None):
    return _like(x), x.new_empty((_rows(x, normalized_shape),), dtype=_stats(x))


def _rms_norm_backward_fake(grad, x, normalized_shape, rstd, want_w, weight=None):
    return _like(x), x.new_empty(tuple(normalized_shape) if want_w else (0,))


# -- registration -------------------------------------------------------------------------------------------
def _use_native() -> bool:
    """Do the CUDA implementations come from the C++ library here (a CUDA device, the library built)?"""
    import torch

    from opsmith.ops import _native
    return bool(torch.cuda.is_available() and _native.usable())


def _register_all() -> None:
    import torch
    import torch.nn.functional as F

    from opsmith._torch._ops import custom_op
    aten = torch.ops.aten
    native = _use_native()
    python_cuda = {}  # op -> its Python CUDA implementation, registered where the C++ one is not

    def define(name, schema, cuda, cpu, fake):
        op = custom_op(f"opsmith::{name}", schema, cpu=cpu)
        python_cuda[op] = cuda
        op.register_fake(fake)
        if name.endswith("_backward"):
            op.not_differentiable(f"opsmith.ops: double backward (a gradient of {name}) is not implemented; "
                                  f"use torch's op where a second derivative is needed")
        return op

    # elementwise: (x) -> y and (grad, x) -> grad_x
    relu = define("relu", "(Tensor x) -> Tensor", lambda x: fn.ew_fwd("relu", x), torch.relu, _like)
    relu_b = define("relu_backward", "(Tensor grad, Tensor x) -> Tensor", lambda g, x: fn.ew_bwd("relu", g, x),
                    lambda g, x: aten.threshold_backward(g, x, 0), lambda g, x: _like(x))
    relu.register_autograd(relu_b.default, save=("x",))

    silu = define("silu", "(Tensor x) -> Tensor", lambda x: fn.ew_fwd("silu", x), F.silu, _like)
    silu_b = define("silu_backward", "(Tensor grad, Tensor x) -> Tensor", lambda g, x: fn.ew_bwd("silu", g, x),
                    aten.silu_backward, lambda g, x: _like(x))
    silu.register_autograd(silu_b.default, save=("x",))

    gelu = define("gelu", '(Tensor x, str approximate="none") -> Tensor',
                  lambda x, approximate="none": fn.ew_fwd(_gelu_op(approximate), x),
                  lambda x, approximate="none": F.gelu(x, approximate=approximate),
                  lambda x, approximate="none": _like(x))
    gelu_b = define("gelu_backward", '(Tensor grad, Tensor x, str approximate="none") -> Tensor',
                    lambda g, x, approximate="none": fn.ew_bwd(_gelu_op(approximate), g, x),
                    lambda g, x, approximate="none": aten.gelu_backward(g, x, approximate=approximate),
                    lambda g, x, approximate="none": _like(x))

    gelu.register_autograd(gelu_b, save=("x", "approximate"))

    # softmax
    softmax = define("softmax", "(Tensor x, int dim=-1) -> Tensor", fn.softmax_cuda, _softmax_cpu,
                     lambda x, dim=-1: _like(x))
    softmax_b = define("softmax_backward", "(Tensor grad, Tensor y, int dim) -> Tensor", fn.softmax_backward_cuda,
                       _softmax_backward_cpu, lambda g, y, dim: _like(y))

    softmax.register_autograd(softmax_b, args=("grad", "out0", "dim"))

    # layer_norm
    ln = define("layer_norm", "(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
                "float eps=1e-05) -> (Tensor, Tensor, Tensor)", _norms.layer_norm_fwd, _layer_norm_cpu, _layer_norm_fake)
    ln_b = define("layer_norm_backward", "(Tensor grad, Tensor x, int[] normalized_shape, Tensor mean, "
                  "Tensor rstd, bool want_w, bool want_b, Tensor? weight=None) -> (Tensor, Tensor, Tensor)",
                  _norms.layer_norm_bwd, _layer_norm_backward_cpu, _layer_norm_backward_fake)

    ln.register_autograd(ln_b, args=("grad0", "x", "normalized_shape", "out1", "out2", "needs_grad(weight)",
                                     "needs_grad(bias)", "weight"), grads_for=("x", "weight", "bias"))

    # rms_norm
    rms = define("rms_norm", "(Tensor x, int[] normalized_shape, Tensor? weight=None, float? eps=None) "
                 "-> (Tensor, Tensor)", _norms.rms_norm_fwd, _rms_norm_cpu, _rms_norm_fake)
    rms_b = define("rms_norm_backward", "(Tensor grad, Tensor x, int[] normalized_shape, Tensor rstd, "
                   "bool want_w, Tensor? weight=None) -> (Tensor, Tensor)", _norms.rms_norm_bwd, _rms_norm_backward_cpu,
                   _rms_norm_backward_fake)

    rms.register_autograd(rms_b, args=("grad0", "x", "normalized_shape", "out1", "needs_grad(weight)", "weight"),
                          grads_for=("x", "weight"))

    # gated activations (silu_and_mul, gelu_and_mul, silu_mul, gelu_mul): their CUDA code is Python everywhere
    from opsmith.ops import _cross_entropy, _fused, _gated, _rotary, _rotary_inplace
    rms_parts = (_rms_norm_cpu, _rms_norm_backward_cpu, _rms_norm_fake, _rms_norm_backward_fake)
    ln_parts = (_layer_norm_cpu, _layer_norm_backward_cpu, _layer_norm_fake, _layer_norm_backward_fake)
    for op in [*_gated.define_all(define), *_fused.define_all(define, rms_parts),
               *_fused.define_layer_norm(define, ln_parts), *_rotary.define_all(define),
               *_cross_entropy.define_all(define)]:
        op.register_kernel("cuda", python_cuda.pop(op))
    _rotary_inplace.define_inplace()  # rotary_embedding_, rotary_embedding_qk_: operators that write their tensors

    if native:
        try:
            from opsmith.ops import _native
            _define_first_outputs()
            _native.register()
            global _native_registered
            _native_registered = True
            return
        except Exception as exc:  # noqa: BLE001  (the Python implementations serve; say why once)
            import logging
            logging.getLogger(__name__).warning("opsmith.ops: the native CUDA kernels could not be registered (%s); "
                                                "using the Python implementations", exc)
    for op, cuda in python_cuda.items():
        op.register_kernel("cuda", cuda)
