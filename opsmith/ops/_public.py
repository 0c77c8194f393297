"""The public functions of ``opsmith.ops``: each checks its arguments and calls its torch operator.

The operators (``torch.ops.opsmith.*``) are defined in ``_register`` on first use; their CUDA
implementations are in ``_functional``.
"""
from __future__ import annotations

from opsmith._errors import SpecError
from opsmith.ops._functional import GELU_KERNELS, _dim, _gated_pair, _gated_rows, _rows_cols

__all__ = ["add_layer_norm", "add_rms_norm", "cross_entropy", "gelu", "gelu_and_mul", "gelu_mul", "layer_norm", "relu", "rms_norm",
           "rotary_embedding", "rotary_embedding_qk", "silu", "silu_and_mul", "silu_mul", "softmax"]


def _shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


def _ops():
    from opsmith.ops._register import ops
    return ops()


_OV: dict = {}     # op name -> OpOverload, once registered: the call skips the lookups
_EAGER: dict = {}  # op name -> what an eager call runs (the OpOverload's builtin: no Python frame)
_compiling = None  # torch.compiler.is_compiling, bound on first use
_warned: list = []  # the eager calls' unavailability, said once


def _op(name: str):
    ov = _OV.get(name)
    if ov is None:
        ov = _OV[name] = getattr(_ops(), name).default
    return ov


def _call(name: str):
    """The callable for op ``name``: ``OpOverload._op`` (the C++ function that
    ``OpOverload.__call__`` calls, without its Python frame) in eager mode; the OpOverload
    itself while ``torch.compile`` traces (dynamo traces OpOverloads, not their builtins).
    ``"layer_norm[0]"`` is layer_norm's first output alone (see :func:`_first`)."""
    global _compiling
    if _compiling is None:
        import torch
        _compiling = torch.compiler.is_compiling
    if _compiling():
        _register_untraced()
        if name.endswith("[0]"):  # traced: the graph drops the statistics anyway
            full = _op(name[:-3])
            return lambda *args: full(*args)[0]
        return _op(name)
    f = _EAGER.get(name)
    if f is None:
        f = _EAGER[name] = _eager(name)
    return f


_FAST = {"relu": "relu", "silu": "silu", "gelu": "gelu", "softmax": "softmax", "layer_norm[0]": "layer_norm_y",
         "rms_norm[0]": "rms_norm_y"}  # public call -> the operator its eager call runs


def _eager(name: str):
    """What an eager call of ``name`` runs: where the C++ kernels serve, the library's function
    that calls the operator with typed arguments (no schema conversion; see
    ``native/osm_ops_python.h``), else the OpOverload's builtin."""
    from opsmith.ops import _register
    if name in _FAST and _register.native_registered():
        from opsmith.ops import _native
        builtins = {op: getattr(ov, "_op", ov) for op, ov in
                    ((op, getattr(_ops(), op).default) for op in _FAST.values())}
        try:
            return getattr(_native.eager_calls(builtins), _FAST[name])
        except Exception as exc:  # noqa: BLE001  (an older library: the builtins serve, said once)
            _warn_once(exc)
    if name.endswith("[0]"):
        return _first(name[:-3])
    ov = _op(name)
    return getattr(ov, "_op", ov)


def _warn_once(exc: Exception) -> None:
    if not _warned:
        import logging
        _warned.append(exc)
        logging.getLogger("opsmith").warning("opsmith.ops: the native library's eager calls are unavailable (%s); "
                                             "calls take torch's generic operator call", exc)


def _register_untraced() -> None:
    """Register the ops. Dynamo runs this function itself rather than tracing it (it is marked
    constant below): on a first call that is compiled, the registration (it takes a lock) must
    not be traced, or a fullgraph compile fails."""
    _ops()


_register_untraced._dynamo_marked_constant = True  # what torch._dynamo.assume_constant_result sets


def _first(name: str):
    """An eager callable returning ``name``'s first output: the C++ composite ``<name>_y``
    where the native kernels serve (no Python objects made for the statistics), else the full
    op and ``[0]``."""
    from opsmith.ops import _register
    if _register.native_registered():
        ov = getattr(_ops(), name + "_y").default
        return getattr(ov, "_op", ov)
    full = _op(name)
    fast = getattr(full, "_op", full)

    def first(*args):
        return fast(*args)[0]
    return first


def relu(x):
    """ReLU: ``max(x, 0)``, NaN kept (as ``torch.relu``); ``torch.ops.opsmith.relu``.

    Examples
    --------
    >>> y = opsmith.ops.relu(torch.randn(1024, device="cuda"))  # doctest: +SKIP
    """
    return _call("relu")(x)


def gelu(x, approximate: str = "none"):
    """GELU, exact (``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))``) or the tanh form
    (``approximate="tanh"``), as ``torch.nn.functional.gelu``; ``torch.ops.opsmith.gelu``."""
    if approximate not in GELU_KERNELS:
        raise SpecError(f"opsmith.ops.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _call("gelu")(x, approximate)


def silu(x):
    """SiLU (swish): ``x * sigmoid(x)``, as ``torch.nn.functional.silu``; ``torch.ops.opsmith.silu``."""
    return _call("silu")(x)


def silu_and_mul(x):
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of last dim ``2 d`` (SwiGLU's middle, vLLM's
    layout); ``torch.ops.opsmith.silu_and_mul``."""
    _gated_rows(x, "silu_and_mul")  # raises the SpecError for an odd last dim
    return _call("silu_and_mul")(x)


def gelu_and_mul(x, approximate: str = "none"):
    """``gelu(x[..., :d], approximate) * x[..., d:]`` (GeGLU's middle);
    ``torch.ops.opsmith.gelu_and_mul``."""
    if approximate not in GELU_KERNELS:
        raise SpecError(f"opsmith.ops.gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    _gated_rows(x, "gelu_and_mul")
    return _call("gelu_and_mul")(x, approximate)


def silu_mul(gate, up):
    """``silu(gate) * up`` (SwiGLU's middle) for ``gate`` and ``up`` of one shape and dtype, any
    leading dims: ``gate_proj(x)`` and ``up_proj(x)``, or views such as the two halves of a
    packed tensor (read in place when each one's rows are evenly spaced);
    ``torch.ops.opsmith.silu_mul``. The gradient flows to both.

    Examples
    --------
    >>> h = opsmith.ops.silu_mul(mlp.gate_proj(x), mlp.up_proj(x))  # doctest: +SKIP
    >>> y = mlp.down_proj(h)                                          # doctest: +SKIP
    """
    if gate.shape != up.shape or gate.dtype != up.dtype:
        _gated_pair(gate, up, "silu_mul")  # raises the SpecError that says what to change
    return _call("silu_mul")(gate, up)


def gelu_mul(gate, up, approximate: str = "none"):
    """``gelu(gate, approximate) * up`` (GeGLU's middle; Gemma's MLP uses ``approximate="tanh"``),
    two tensors as :func:`silu_mul`; ``torch.ops.opsmith.gelu_mul``.

    Examples
    --------
    >>> h = opsmith.ops.gelu_mul(mlp.gate_proj(x), mlp.up_proj(x), "tanh")  # doctest: +SKIP
    """
    if approximate not in GELU_KERNELS:
        raise SpecError(f"opsmith.ops.gelu_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    if gate.shape != up.shape or gate.dtype != up.dtype:
        _gated_pair(gate, up, "gelu_mul")
    return _call("gelu_mul")(gate, up, approximate)


def softmax(x, dim: int = -1):
    """Softmax along ``dim`` (numerically stable), as ``torch.softmax(x, dim)``;
    ``torch.ops.opsmith.softmax``. The last dim is the fast path; another dim is moved last
    (a copy) and back."""
    nd = x.dim() or 1
    if not -nd <= dim < nd:
        _dim(x, dim)  # raises the SpecError that says so
    return _call("softmax")(x, dim)


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
    return _call("layer_norm[0]")(x, shape, weight, bias, float(eps))


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None):
    """RMS norm over the last dims, as ``torch.nn.functional.rms_norm`` (``eps=None``: the
    dtype's machine epsilon, as torch); ``torch.ops.opsmith.rms_norm(...)[0]`` (``rms_norm_y`` where the
    C++ kernels serve)."""
    shape = _last_dims(x, normalized_shape, "rms_norm")
    if weight is not None and weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    return _call("rms_norm[0]")(x, shape, weight, None if eps is None else float(eps))


def add_rms_norm(x, residual, normalized_shape, weight=None, eps: float | None = None):
    """``residual_out = x + residual`` and ``y = rms_norm(residual_out, normalized_shape, weight,
    eps)`` in one pass (a pre-norm block's residual stream); returns ``(y, residual_out)``.
    ``torch.ops.opsmith.add_rms_norm`` (its third output, rstd, is for the backward)."""
    shape = _last_dims(x, normalized_shape, "add_rms_norm")
    if weight is not None and weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    y, s, _ = _call("add_rms_norm")(x, residual, shape, weight, None if eps is None else float(eps))
    return y, s


def add_layer_norm(x, residual, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """``residual_out = x + residual`` and ``y = layer_norm(residual_out, normalized_shape, weight,
    bias, eps)``; returns ``(y, residual_out)``. ``torch.ops.opsmith.add_layer_norm`` (its mean and
    rstd outputs are for the backward). On CUDA x and residual are read once (one kernel, or two passes
    over the new residual in L2 on rows past 16 KiB); the backward adds the residual's gradient in its kernel."""
    shape = _last_dims(x, normalized_shape, "add_layer_norm")
    if weight is not None and weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    y, s, _, _ = _call("add_layer_norm")(x, residual, shape, weight, bias, float(eps))
    return y, s


def rotary_embedding(x, cos, sin, positions=None, *, interleaved: bool = False, inplace: bool = False):
    """Rotary position embedding of ``x`` (``[..., head_dim]``, up to 4 leading dims): each
    row's first ``2 * half`` elements rotated in pairs, neox layout ``(j, j + half)`` or, with
    ``interleaved=True``, GPT-J's ``(2j, 2j + 1)``; the rest copied. ``cos``/``sin`` end in
    ``half`` and broadcast against ``x.shape[:-1]`` (numpy rules, right-aligned: for ``x``
    ``[batch, heads, seq, head_dim]`` pass ``[seq, half]`` or ``[batch, 1, seq, half]``); with
    ``positions`` (integers broadcast the same way) they are tables ``[max_position, half]``.
    The gradient flows to ``x`` only. ``torch.ops.opsmith.rotary_embedding``.

    ``inplace=True`` writes the rotation over ``x`` and returns ``x``
    (``torch.ops.opsmith.rotary_embedding_``): one pass where ``x`` is contiguous or a permuted
    contiguous tensor, else rotated out of place and copied back. With autograd ``x`` must not be a
    leaf that requires grad (torch forbids writing one); its gradient is the inverse rotation."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if inplace:
        from opsmith.ops._rotary_inplace import rotate_inplace
        return rotate_inplace(x, cos, sin, positions, bool(interleaved), _call("rotary_embedding_"))
    return _call("rotary_embedding")(x, cos, sin, positions, bool(interleaved))


def rotary_embedding_qk(q, k, cos, sin, positions=None, *, interleaved: bool = False, inplace: bool = False):
    """:func:`rotary_embedding` of ``q`` and of ``k`` by the same ``cos``/``sin`` (and
    ``positions``) in one CUDA launch, as attention applies it; returns ``(q_rot, k_rot)``. They
    must share dtype, device and head dim; ``k`` may have fewer heads (grouped-query attention).
    ``torch.ops.opsmith.rotary_embedding_qk``; ``inplace=True`` writes both rotations over ``q``
    and ``k`` (which must not overlap) and returns ``(q, k)``
    (``torch.ops.opsmith.rotary_embedding_qk_``), as :func:`rotary_embedding`'s ``inplace``."""
    if cos.dtype != q.dtype:
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    if inplace:
        from opsmith.ops._rotary_inplace import rotate_qk_inplace
        return rotate_qk_inplace(q, k, cos, sin, positions, bool(interleaved), _call("rotary_embedding_qk_"))
    return _call("rotary_embedding_qk")(q, k, cos, sin, positions, bool(interleaved))


def cross_entropy(logits, target, *, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, z_loss: float = 0.0):
    """Cross-entropy of ``logits`` ``[N, V]`` against class indices ``target`` ``[N]`` (int64), as
    ``torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=..., reduction=...,
    label_smoothing=...)`` plus ``z_loss * lse**2`` per row (``lse = logsumexp(logits[i])``,
    PaLM's z-loss; averaged over the valid rows by ``"mean"``). Rows whose target is
    ``ignore_index`` count for nothing. Returns the logits' dtype (math in float32).
    ``torch.ops.opsmith.cross_entropy(...)[0]``.

    The forward reads the logits once; the backward reads them once more and writes their
    gradient (out of place: the logits are never overwritten). On CUDA a target outside
    ``[0, V)`` that is not ``ignore_index`` stops the kernel with a device-side assertion, as
    torch's own cross-entropy does; on CPU it raises a ``SpecError``.

    Examples
    --------
    >>> logits = torch.randn(4096, 32000, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # doctest: +SKIP
    >>> target = torch.randint(0, 32000, (4096,), device="cuda")                                    # doctest: +SKIP
    >>> opsmith.ops.cross_entropy(logits, target, label_smoothing=0.1).backward()                   # doctest: +SKIP
    """
    return _call("cross_entropy")(logits, target, int(ignore_index), reduction, float(label_smoothing),
                                  float(z_loss))[0]
