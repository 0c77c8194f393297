"""The ops' CUDA implementations over the kernels (the public functions are in ``_public``).

The CUDA implementations (``ew_fwd``, ``ew_bwd``, ``softmax_cuda``, ``layer_norm_fwd`` ...)
are what the torch operators ``torch.ops.opsmith.*`` run on CUDA tensors (``_register``
defines the operators, their CPU code, fake kernels and autograd). Inputs are made contiguous
first (a copy for a non-contiguous view; the gated ops read views whose rows are evenly spaced,
such as the halves of a packed tensor, in place); softmax over a dim other than the last moves that
dim last (a copy), runs, and moves it back (another copy). Outputs are contiguous.
Supported CUDA dtypes: float32, float16, bfloat16 and float64.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from opsmith._errors import SpecError
from opsmith.ops import _launch, _launch_gated, _sources

__all__ = ["ew_fwd", "ew_bwd", "gated_fwd", "gated_bwd", "gated_mul_fwd", "gated_mul_bwd", "GATED_KERNELS",
           "GATED_PAIR_OPS", "softmax_cuda", "softmax_backward_cuda", "GELU_KERNELS"]

_EW = "elementwise.cu"
GELU_KERNELS = {"none": "gelu_erf", "tanh": "gelu_tanh"}
GATED_KERNELS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}
GATED_PAIR_OPS = {"silu": "silu_mul", "gelu": "gelu_mul", "gelu_tanh": "gelu_mul"}  # the two-input ops


def _dtype_name(x, op: str) -> str:
    name = str(x.dtype).replace("torch.", "")
    if name not in _sources.DTYPES:
        raise SpecError(f"opsmith.ops.{op}: CUDA tensors of dtype {x.dtype} are not supported; use "
                        f"float32, float16, bfloat16 or float64 (x.float() converts)")
    return name


def _kernel(file: str, name: str, x):
    return _sources.kernel(file, name, _dtype_name(x, name.split("_")[0]), x.get_device())


# -- elementwise ------------------------------------------------------------------------------
def ew_fwd(op: str, x):
    """``y = op(x)`` for op in relu, gelu_erf, gelu_tanh, silu (CUDA)."""
    import torch
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        props = _launch.device_props(x.get_device())
        plan = _launch.elementwise_plan(n, x.element_size(), props, _launch.ew_unrolled(op))
        _kernel(_EW, op + "_fwd<{T}>", x).launch(_launch.launch_config(plan), x, y, n)
    return y


def ew_bwd(op: str, grad_y, x):
    """``grad_x = grad_y * op'(x)`` (CUDA)."""
    import torch
    x = x.contiguous()
    g = grad_y.contiguous()
    if g.dtype != x.dtype:
        g = g.to(x.dtype)
    dx = torch.empty_like(x)
    n = x.numel()
    if n:
        plan = _launch.elementwise_plan(n, x.element_size(), _launch.device_props(x.get_device()))
        _kernel(_EW, op + "_bwd<{T}>", x).launch(_launch.launch_config(plan), g, x, dx, n)
    return dx


# -- gated activations: act(gate) * up, gate and up two tensors or the halves of x = [gate | up] ------
def _gated_rows(x, op: str) -> tuple[int, int]:
    two_d = x.shape[-1] if x.dim() else 0
    if x.dim() == 0 or two_d % 2:
        raise SpecError(f"opsmith.ops.{op}: the last dim of x holds [gate | up] and must be even, got shape "
                        f"{tuple(x.shape)}")
    return (x.numel() // two_d if two_d else 0), two_d // 2


def _gated_pair(gate, up, op: str) -> tuple[int, int]:
    """(rows, d) of a two-input gated op's ``gate`` and ``up``: one shape, dtype and device."""
    if gate.shape != up.shape:
        raise SpecError(f"opsmith.ops.{op}: gate has shape {tuple(gate.shape)} and up {tuple(up.shape)}; they must "
                        f"be equal (no broadcasting: expand or reshape one of them first)")
    if gate.dtype != up.dtype:
        raise SpecError(f"opsmith.ops.{op}: gate has dtype {gate.dtype} and up {up.dtype}; convert one with "
                        f".to(gate.dtype)")
    if gate.device != up.device:
        raise SpecError(f"opsmith.ops.{op}: gate is on {gate.device} and up on {up.device}; move one with "
                        f".to(gate.device)")
    d = gate.shape[-1] if gate.dim() else 1
    return (gate.numel() // d if d else 0), d


def _row_span(t, d: int):
    """``(span, row_stride)``: a contiguous 1-d view of ``t``'s memory from its first element
    (what a kernel pointer takes) and the distance between its rows of ``d`` elements; None
    when ``t``'s rows are not evenly spaced with contiguous columns (then the caller copies)."""
    if d > 1 and t.stride(-1) != 1:
        return None
    try:
        rows = t.view(-1, d)
    except RuntimeError:  # leading dims that no single stride walks (a transposed view)
        return None
    n = rows.shape[0]
    stride = rows.stride(0) if n > 1 else d
    return t.as_strided(((n - 1) * stride + d,), (1,)), stride


def _rows_of(t, d: int):
    got = _row_span(t, d)
    return got if got is not None else (t.contiguous().view(-1), d)


def _gated_launch(act: str, direction: str, op: str, ref, rows: int, d: int, *args) -> None:
    """gated.cu's ``<act>_and_mul_<direction>`` (act: silu, gelu, gelu_tanh) on its plan, or its
    ``_one`` form where :func:`_launch_gated.gated_one` allows; ``args``: the kernel's arrays, then its
    row strides."""
    itemsize = ref.element_size()
    plan = _launch_gated.gated_plan(rows, d, itemsize, _launch.device_props(ref.get_device()), act)
    arrays = 3 if direction == "fwd" else 5
    kernel = f"{GATED_KERNELS[act]}_{direction}"
    strides = args[arrays:]
    if _launch_gated.gated_one(plan, rows, d, itemsize, act, [t.data_ptr() for t in args[:arrays]], strides):
        kernel, ints = kernel + "_one", (rows, d // (16 // itemsize), *strides)
    else:
        ints = (rows, d, *strides)
    _sources.kernel("gated.cu", kernel + "<{T}>", _dtype_name(ref, op), ref.get_device()).launch(
        _launch.launch_config(plan), *args[:arrays], *ints)


def _grad_like(grad_y, shape, ref, op: str):
    if tuple(grad_y.shape) != tuple(shape):
        raise SpecError(f"opsmith.ops.{op}: grad has shape {tuple(grad_y.shape)}, expected {tuple(shape)}")
    g = grad_y.contiguous()
    return g.to(ref.dtype) if g.dtype != ref.dtype else g


def gated_mul_fwd(op: str, gate, up):
    """``act(gate) * up`` for op in silu, gelu, gelu_tanh (CUDA): ``gate`` and ``up`` of one
    shape, read in place when each one's rows are evenly spaced (a view such as a half of a
    packed tensor), else copied first; the output is contiguous."""
    import torch
    name = GATED_PAIR_OPS[op]
    rows, d = _gated_pair(gate, up, name)
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if rows and d:
        (a, sa), (b, sb) = _rows_of(gate, d), _rows_of(up, d)
        _gated_launch(op, "fwd", name, gate, rows, d, a, b, y.view(-1), sa, sb)
    return y


def gated_mul_bwd(op: str, grad_y, gate, up):
    """The gradients of :func:`gated_mul_fwd` for ``gate`` and ``up`` (CUDA), contiguous."""
    import torch
    name = GATED_PAIR_OPS[op]
    rows, d = _gated_pair(gate, up, name)
    g = _grad_like(grad_y, gate.shape, gate, name)
    dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty_like(dg)
    if rows and d:
        (a, sa), (b, sb) = _rows_of(gate, d), _rows_of(up, d)
        _gated_launch(op, "bwd", name, gate, rows, d, g.view(-1), a, b, dg.view(-1), du.view(-1), sa, sb, d)
    return dg, du


def gated_fwd(op: str, x):
    """``act(x[..., :d]) * x[..., d:]`` for op in silu, gelu, gelu_tanh (CUDA): the kernel
    reads the two halves of each row in place."""
    import torch
    name = GATED_KERNELS[op]
    rows, d = _gated_rows(x, name)
    y = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if rows and d:
        x = x if _row_span(x, 2 * d) is not None else x.contiguous()  # then both halves are spans too
        (a, sa), (b, sb) = _rows_of(x[..., :d], d), _rows_of(x[..., d:], d)
        _gated_launch(op, "fwd", name, x, rows, d, a, b, y.view(-1), sa, sb)
    return y


def gated_bwd(op: str, grad_y, x):
    """The gradient of :func:`gated_fwd` for ``x`` (CUDA): ``[d_gate | d_up]``, contiguous."""
    import torch
    name = GATED_KERNELS[op]
    rows, d = _gated_rows(x, name)
    g = _grad_like(grad_y, (*x.shape[:-1], d), x, name)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows and d:
        x = x if _row_span(x, 2 * d) is not None else x.contiguous()
        (a, sa), (b, sb) = _rows_of(x[..., :d], d), _rows_of(x[..., d:], d)
        (da, _), (db, _) = _rows_of(dx[..., :d], d), _rows_of(dx[..., d:], d)
        _gated_launch(op, "bwd", name, x, rows, d, g.view(-1), a, b, da, db, sa, sb, 2 * d)
    return dx


# -- softmax ------------------------------------------------------------------------------------
def softmax_fwd(x):
    """Softmax over the last dim of a CUDA tensor."""
    import torch
    x = x.contiguous()
    y = torch.empty_like(x)
    cols = x.shape[-1] if x.dim() else 1
    if x.numel():
        rows = x.numel() // cols
        plan = _launch.softmax_plan(rows, cols, x.element_size(), 1, _launch.device_props(x.get_device()))
        file, name = _launch.softmax_fwd_kernel(plan, cols, x.element_size(), (x.data_ptr() | y.data_ptr()) % 16 == 0)
        k = _kernel(file, name, x)
        if plan.strategy == "long":
            k.launch(_launch.launch_config(plan), x, y, rows, cols, plan.cache)
        elif plan.strategy == "cluster":
            k.launch(_launch.launch_config(_resident(k, plan)), x, y, rows, cols)
        else:
            k.launch(_launch.launch_config(plan), x, y, rows, cols)
    return y


def softmax_bwd(grad_y, y):
    """``grad_x = y * (grad_y - sum(grad_y * y))`` over the last dim (CUDA)."""
    import torch
    y = y.contiguous()
    g = grad_y.contiguous().to(y.dtype)
    dx = torch.empty_like(y)
    cols = y.shape[-1] if y.dim() else 1
    if y.numel():
        rows = y.numel() // cols
        plan = _launch.softmax_plan(rows, cols, y.element_size(), 2, _launch.device_props(y.get_device()))
        if plan.strategy == "long":
            _kernel("softmax.cu", "softmax_bwd_long<{T}>", y).launch(
                _launch.launch_config(plan), g, y, dx, rows, cols, plan.cache)
        elif plan.strategy == "cluster":
            k = _kernel("softmax_cluster.cu", f"softmax_bwd_cluster<{plan.cluster}, {plan.chunks}, {{T}}>", y)
            k.launch(_launch.launch_config(_resident(k, plan)), g, y, dx, rows, cols)
        else:
            chunks = plan.chunks or _launch.WIDE_CHUNKS  # WIDE8_CHUNKS: float rows past WIDE_CHUNKS
            wide = "softmax_bwd_wide_sm" if plan.shared_mem else "softmax_bwd_wide"  # grad_y staged (_launch._staged)
            name = f"{wide}<{{T}}, {chunks}>" if plan.strategy == "wide" else "softmax_bwd<{T}>"
            _kernel("softmax.cu", name, y).launch(_launch.launch_config(plan), g, y, dx, rows, cols)
    return dx


def softmax_cuda(x, dim: int = -1):
    """``torch.ops.opsmith.softmax`` on CUDA: the last dim in place, another moved last and back."""
    d = _dim(x, dim)
    if x.dim() == 0 or d == x.dim() - 1:
        return softmax_fwd(x)
    return softmax_fwd(x.movedim(d, -1)).movedim(-1, d).contiguous()


def softmax_backward_cuda(grad, y, dim: int):
    """``torch.ops.opsmith.softmax_backward`` on CUDA."""
    d = _dim(y, dim)
    if y.dim() == 0 or d == y.dim() - 1:
        return softmax_bwd(grad, y)
    return softmax_bwd(grad.movedim(d, -1), y.movedim(d, -1)).movedim(-1, d).contiguous()


def _dim(x, dim: int) -> int:
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise SpecError(f"opsmith.ops.softmax: dim {dim} is out of range for a {x.dim()}-d tensor")
    return dim % nd


# -- what the norms (_norms.py), add_rms_norm, softmax and cross_entropy share ---------------------------

def _resident(k, plan):
    """``plan`` of kernel ``k``, a persistent cluster plan (``"cluster"``: the norms', add_rms_norm's and softmax's)
    with no more clusters than the device holds at once (``Kernel.active_clusters``; the plans count SMs, but a
    cluster's blocks share a GPC and GPCs leave SMs over): the clusters past that ran after the others, their rows'
    time twice. H100, float32 2048x32768 rms_norm backward, 8 blocks of 512 threads
    (bench/results/ops-fp32-rows-h100-2026-11-27/fp32rows2.json): 16 clusters (the SMs' count) 463 us, 14 299;
    4096x16384 at 256 threads (the driver: 30 at once): 33 386 us, 28 291 (fp32rows3.json, as shipped: 293.2 and
    290.1). softmax's plans ask no more than an H100 holds (bench/results/ops-l2-weights-h100-2026-11-27/smx.json).
    """
    if plan.strategy != "cluster":
        return plan
    held = k.active_clusters(_launch.launch_config(plan))
    return plan._replace(grid=(held * plan.cluster,)) if 0 < held < plan.grid[0] // plan.cluster else plan


def _rows_cols(x, normalized_shape: Sequence[int], op: str) -> tuple[int, int]:
    shape = tuple(int(s) for s in normalized_shape)
    if tuple(x.shape[x.dim() - len(shape):]) != shape or len(shape) > x.dim():
        raise SpecError(f"opsmith.ops.{op}: normalized_shape {list(shape)} must be the last dims of the "
                        f"input, whose shape is {list(x.shape)}")
    cols = math.prod(shape)
    return (x.numel() // cols if cols else 0), cols


def _stats_dtype(x):
    import torch
    return torch.float64 if x.dtype == torch.float64 else torch.float32
