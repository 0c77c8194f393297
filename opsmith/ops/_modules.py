"""Thin ``torch.nn.Module`` wrappers of the opsmith.ops functions (same parameters as torch's).

Each module has an ``inductor`` attribute (False unless ``opsmith.ops.patch(model,
under_compile="inductor")`` set it): when True, the module runs torch's own ops while
``torch.compile`` traces it (:func:`compiling`), so that inductor can fuse them with their
neighbours, and opsmith's kernels otherwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from opsmith.ops import _public as F
from opsmith.ops import _sources

__all__ = ["GELU", "CrossEntropyLoss", "GELUAndMul", "LayerNorm", "RMSNorm", "ReLU", "SiLU", "SiLUAndMul",
           "Softmax"]


FLOATS = tuple(getattr(torch, name) for name in _sources.DTYPES)  # the dtypes opsmith's kernels take


def compiling() -> bool:
    """True while torch.compile (dynamo) traces the caller."""
    fn = getattr(torch.compiler, "is_compiling", None)
    return bool(fn()) if fn is not None else False


class ReLU(torch.nn.Module):
    """``torch.nn.ReLU`` on opsmith's kernel."""

    inductor = False

    def forward(self, x):
        return torch.relu(x) if self.inductor and compiling() else F.relu(x)


class GELU(torch.nn.Module):
    """``torch.nn.GELU(approximate="none" | "tanh")`` on opsmith's kernels."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    inductor = False

    def forward(self, x):
        if self.inductor and compiling():
            return TF.gelu(x, approximate=self.approximate)
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(torch.nn.Module):
    """``torch.nn.SiLU`` on opsmith's kernel."""

    inductor = False

    def forward(self, x):
        return TF.silu(x) if self.inductor and compiling() else F.silu(x)


class SiLUAndMul(torch.nn.Module):
    """``silu(x[..., :d]) * x[..., d:]``: the middle of a SwiGLU MLP with packed gate/up weights."""

    def forward(self, x):
        return F.silu_and_mul(x)


class GELUAndMul(torch.nn.Module):
    """``gelu(x[..., :d], approximate) * x[..., d:]``: the middle of a GeGLU MLP."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu_and_mul(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(torch.nn.Module):
    """``torch.nn.Softmax(dim)`` on opsmith's kernels."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LayerNorm(torch.nn.Module):
    """``torch.nn.LayerNorm`` on opsmith's kernels (weight ones, bias zeros at start)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = F._shape(normalized_shape)
        self.eps = eps
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, **kw)) if elementwise_affine else None
        self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, **kw)) if elementwise_affine and bias else None

    inductor = False

    def forward(self, x):
        if self.inductor and compiling():
            return TF.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class RMSNorm(torch.nn.Module):
    """``torch.nn.RMSNorm`` on opsmith's kernels (``eps=None``: the input dtype's epsilon)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = F._shape(normalized_shape)
        self.eps = eps
        self.weight = (torch.nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
                       if elementwise_affine else None)

    inductor = False

    def forward(self, x):
        if self.inductor and compiling():
            return TF.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class CrossEntropyLoss(torch.nn.Module):
    """``torch.nn.CrossEntropyLoss(ignore_index=..., reduction=..., label_smoothing=...)`` on
    opsmith's kernels, with PaLM's ``z_loss`` (``z_loss * lse**2`` a row); ``forward(logits,
    target)`` takes ``logits`` ``[N, V]`` and ``target`` ``[N]`` (int64). No class weights.

    Examples
    --------
    >>> loss = opsmith.ops.CrossEntropyLoss(label_smoothing=0.1)(logits.view(-1, vocab), labels.view(-1))  # doctest: +SKIP
    """

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 z_loss: float = 0.0) -> None:
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.z_loss = label_smoothing, z_loss

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing, z_loss=self.z_loss)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}")
