"""The public functions of ``opsmith.ops``: each checks its arguments and calls its torch operator.

The operators (``torch.ops.opsmith.*``) are defined in ``_register`` on first use; their CUDA
implementations are in ``_functional``.
"""
from __future__ import annotations

from opsmith._errors import SpecError
from opsmith.ops._functional import GELU_KERNELS, _dim, _rows_cols

__all__ = ["gelu", "layer_norm", "relu", "rms_norm", "silu", "softmax"]


def _shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


def _ops():
    from opsmith.ops._register import ops
    return ops()


_OV: dict = {}  # op name -> OpOverload, once registered: the call skips the lookups


def _op(name: str):
    ov = _OV.get(name)
    if ov is None:
        ov = _OV[name] = getattr(_ops(), name).default
    return ov


_FIRST: dict = {}  # "layer_norm" -> a callable returning the op's first output


def _first(name: str):
    """``name``'s first output: the C++ composite ``<name>_y`` where the native kernels serve,
    else the full op and ``[0]``."""
    f = _FIRST.get(name)
    if f is None:
        from opsmith.ops import _register
        if _register.native_registered():
            f = getattr(_ops(), name + "_y").default
        else:
            full = _op(name)

            def f(*args):
                return full(*args)[0]
        _FIRST[name] = f
    return f


def relu(x):
    """ReLU: ``max(x, 0)``, NaN kept (as ``torch.relu``); ``torch.ops.opsmith.relu``.

    Examples
    --------
    >>> y = opsmith.ops.relu(torch.randn(1024, device="cuda"))  # doctest: +SKIP
    """
    return _op("relu")(x)


def gelu(x, approximate: str = "none"):
    """GELU, exact (``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))``) or the tanh form
    (``approximate="tanh"``), as ``torch.nn.functional.gelu``; ``torch.ops.opsmith.gelu``."""
    if approximate not in GELU_KERNELS:
        raise SpecError(f"opsmith.ops.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _op("gelu")(x, approximate)


def silu(x):
    """SiLU (swish): ``x * sigmoid(x)``, as ``torch.nn.functional.silu``; ``torch.ops.opsmith.silu``."""
    return _op("silu")(x)


def softmax(x, dim: int = -1):
    """Softmax along ``dim`` (numerically stable), as ``torch.softmax(x, dim)``;
    ``torch.ops.opsmith.softmax``. The last dim is the fast path; another dim is moved last
    (a copy) and back."""
    nd = x.dim() or 1
    if not -nd <= dim < nd:
        _dim(x, dim)  # raises the SpecError that says so
    return _op("softmax")(x, dim)


def _last_dims(x, normalized_shape, op: str) -> list:
    """``normalized_shape`` as the op's ``int[]``, checked against ``x``'s last dims (cheaply:
    this runs on every call)."""
    if isinstance(normalized_shape, int):
        if x.dim() and x.shape[-1] == normalized_shape:
            return [normalized_shape]
        shape: tuple = (normalized_shape,)
    else:
        shape = tuple(normalized_shape)
        n = len(shape)
        if n <= x.dim() and x.shape[x.dim() - n:] == shape:
            return list(shape)
    _rows_cols(x, _shape(shape), op)  # raises the SpecError that says what is wrong
    return list(shape)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Layer norm over the last dims, as ``torch.nn.functional.layer_norm`` (weight and bias
    optional; biased variance; statistics in float32, float64 for float64 inputs);
    ``torch.ops.opsmith.layer_norm(...)[0]`` (``layer_norm_y`` where the C++ kernels serve)."""
    shape = _last_dims(x, normalized_shape, "layer_norm")
    if weight is not None and weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return _first("layer_norm")(x, shape, weight, bias, float(eps))


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None):
    """RMS norm over the last dims, as ``torch.nn.functional.rms_norm`` (``eps=None``: the
    dtype's machine epsilon, as torch); ``torch.ops.opsmith.rms_norm(...)[0]`` (``rms_norm_y`` where the
    C++ kernels serve)."""
    shape = _last_dims(x, normalized_shape, "rms_norm")
    if weight is not None and weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    return _first("rms_norm")(x, shape, weight, None if eps is None else float(eps))
