"""Residual add + RMSNorm / LayerNorm as torch operators: ``add_rms_norm``, ``add_layer_norm``
and their backwards.

=====================  =====================================================================
``add_rms_norm``       ``(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight=None,
                       float? eps=None) -> (Tensor y, Tensor residual_out, Tensor rstd)``:
                       ``residual_out = x + residual``, ``y = rms_norm(residual_out) * weight``
``add_rms_norm_backward``  ``(grad, s, normalized_shape, rstd, want_w, weight, grad_residual)
                       -> (grad_s, grad_weight)``: rms_norm's backward on ``s`` plus the gradient
                       that reached ``residual_out`` (added inside rms_norm's backward kernel on
                       CUDA); ``x`` and ``residual`` both get ``grad_s``
=====================  =====================================================================

``add_layer_norm``     ``(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight=None,
                       Tensor? bias=None, float eps=1e-05) -> (y, residual_out, mean, rstd)``
``add_layer_norm_backward``  layer_norm's backward on ``s`` plus ``grad_residual``

On CUDA add_rms_norm's forward is one kernel (``kernels/fused_norm.cu``) for rows that fit in
registers, else an add and rms_norm's long-row kernel. add_layer_norm's forward is one kernel on
layer_norm's register rows (up to 16 KiB) and on its L2 rows (longer, in whole aligned vectors), else an
add and layer_norm's kernels. Both backwards are their norm's on ``s`` with the residual's
gradient added inside the norm's backward kernels (after the few-row and long-row ones that take
none). The CUDA implementations are Python on every machine.
"""
from __future__ import annotations

from opsmith._errors import SpecError
from opsmith.ops import _functional as fn
from opsmith.ops import _norms
from opsmith.ops import _launch, _launch_norm, _sources

__all__ = ["add_layer_norm_cuda", "add_rms_norm_cuda", "define_all", "define_layer_norm"]


def _check(x, residual, op: str = "add_rms_norm") -> None:
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise SpecError(f"opsmith.ops.{op}: residual must match x (shape {tuple(x.shape)}, {x.dtype}, "
                        f"{x.device}); got shape {tuple(residual.shape)}, {residual.dtype}, {residual.device}")


def add_rms_norm_cuda(x, residual, normalized_shape, weight=None, eps: float | None = None):
    """(y, residual_out, rstd) on CUDA: one pass where the row fits in registers (fused_norm.cu: up to 64 KiB in
    whole 16-byte vectors at 8 chunks a thread); longer rows in whole 16-byte vectors, two passes over the row in
    L2 (norm_l2.cu); a cluster's (sm_90+: norm_cluster.cu, the rows rms_norm's cluster forward takes); else
    torch's add, then rms_norm."""
    import torch
    _check(x, residual)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    x, residual = x.contiguous(), residual.contiguous()
    rows, cols = fn._rows_cols(x, normalized_shape, "add_rms_norm")
    plan, file = _norms._fwd_plan(rows, cols, x) if rows and cols else (None, "")
    w = weight.contiguous() if weight is not None else x
    # rows past the register strategy (16 KiB or more): up to 64 KiB one pass of 8 chunks a thread
    # (add_rms_c8_plan), else two passes, the second from L2 (norm_l2.cu); y and s are new: aligned. The L2 rows
    # on an H200 (bench/diag_norm_l2.py): bf16 4096x16384 3,629 -> 3,777 GB/s, 1024x65536 2,704 -> 3,629, fp32
    # 8192x8192 3,245 -> 3,828; on register rows of 16 KiB they ran slower (bf16 8192x8192 4,116 against 3,856)
    props = _launch.device_props(x.get_device())
    past = file not in ("norm.cu", "")
    if past and (c8 := _norms._if_aligned(_launch_norm.add_rms_c8_plan(rows, cols, x.element_size(), props),
                                          (x, residual, w))) is not None:  # to 64 KiB: read once, 8 chunks a thread
        plan, file, name = c8, "fused_norm.cu", _launch_norm.add_rms_c8_kernel(c8) + "<{T}, {A}>"
    elif past and (l2 := _norms._l2_plan(rows, cols, props, 1, x, residual, w)) is not None:
        plan, file, name = l2, "norm_l2.cu", _launch_norm.l2_kernel("add_rms_norm", l2)
    elif file == "norm.cu":  # the register rows (those that fill their chunks: the unchecked row alone)
        full = _launch.full_rows(plan, cols, x.element_size(), _norms._aligned(x, residual, w))
        file, name = "fused_norm.cu", "add_rms_norm_fwd_full<{T}, {A}>" if full else "add_rms_norm_fwd<{T}, {A}>"
    elif file == "norm_cluster.cu":  # a cluster a row (sm_90+)
        name = f"add_rms_norm_fwd_cluster<{plan.cluster}, {plan.chunks}, {{T}}, {{A}}>"
    else:  # the long rows, or an empty input: an add and rms_norm
        s = x + residual
        y, rstd = _norms.rms_norm_fwd(s, normalized_shape, weight, eps)
        return y, s, rstd
    y, s = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(rows, dtype=fn._stats_dtype(x), device=x.device)
    k = _sources.kernel(file, name, fn._dtype_name(x, "add_rms_norm"), x.get_device())
    plan = fn._resident(k, plan)
    k.launch(_launch.launch_config(plan), x, residual, w, y, s, rstd, rows, cols, float(eps), int(weight is not None))
    return y, s, rstd


def _cpu(rms_cpu):
    def run(x, residual, normalized_shape, weight=None, eps=None):
        _check(x, residual)
        s = x + residual
        y, rstd = rms_cpu(s, normalized_shape, weight, eps)
        return y, s, rstd
    return run


def _fake(rms_fake):
    def run(x, residual, normalized_shape, weight=None, eps=None):
        y, rstd = rms_fake(x, normalized_shape, weight, eps)
        return y, x.new_empty(x.shape), rstd
    return run


def _backward(rms_backward, fused: bool = False):
    """add_rms_norm's backward over rms_norm's: ``grad_residual`` added to grad_s, by the kernel
    itself where ``fused`` (CUDA), else after it."""
    def run(grad, s, normalized_shape, rstd, want_w, weight=None, grad_residual=None):
        if fused:
            return rms_backward(grad, s, normalized_shape, rstd, want_w, weight, grad_residual)
        ds, dw = rms_backward(grad, s, normalized_shape, rstd, want_w, weight)
        return (ds + grad_residual if grad_residual is not None else ds), dw
    return run


def define_all(define, rms) -> list:
    """Define both operators through ``define(name, schema, cuda, cpu, fake)`` with the forward's
    autograd, over rms_norm's CPU code and fake kernels (``rms``: cpu, backward_cpu, fake,
    backward_fake, from ``_register``); returns the ops whose CUDA implementation is registered
    on every machine."""
    cpu, backward_cpu, fake, backward_fake = rms
    op = define("add_rms_norm", "(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight=None, "
                "float? eps=None) -> (Tensor, Tensor, Tensor)", add_rms_norm_cuda, _cpu(cpu), _fake(fake))
    back = define("add_rms_norm_backward", "(Tensor grad, Tensor s, int[] normalized_shape, Tensor rstd, "
                  "bool want_w, Tensor? weight=None, Tensor? grad_residual=None) -> (Tensor, Tensor)",
                  _backward(_norms.rms_norm_bwd, fused=True), _backward(backward_cpu), _backward(backward_fake))

    def setup_context(ctx, inputs, output):
        _x, _residual, shape, weight, _eps = inputs
        _, s, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(s, rstd, weight)
        ctx.shape = list(shape)

    def backward(ctx, gy, gs, _grstd):
        import torch
        s, rstd, weight = ctx.saved_tensors
        want_w = weight is not None and bool(ctx.needs_input_grad[4])  # [0] is the key set
        if gy is None:
            gy = torch.zeros_like(s)
        ds, dw = back.default(gy, s, ctx.shape, rstd, want_w, weight, gs)
        return ds, ds, None, (dw if want_w else None), None

    op.register_autograd(backward, setup_context)
    return [op, back]


def _add_layer_norm(layer_norm):
    """add_layer_norm's forward over a layer_norm forward: ``(y, residual_out, mean, rstd)``."""
    def forward(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
        _check(x, residual, "add_layer_norm")
        s = x + residual
        y, mean, rstd = layer_norm(s, normalized_shape, weight, bias, eps)
        return y, s, mean, rstd
    return forward


_add_then_layer_norm = _add_layer_norm(_norms.layer_norm_fwd)


def add_layer_norm_cuda(x, residual, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """(y, residual_out, mean, rstd) on CUDA: one pass over x and residual on layer_norm's register rows (up to
    16 KiB: fused_norm.cu's add_layer_norm_fwd*, on the plan layer_norm itself takes there: 2 chunks a thread, or 4
    on norm_c4_plan's rows); longer rows in whole aligned 16-byte vectors two passes, the second over the new
    residual from L2 (norm_l2.cu's add_layer_norm_fwd_l2: x and residual read once); else torch's add, then
    layer_norm's kernels."""
    import torch
    _check(x, residual, "add_layer_norm")
    x, residual = x.contiguous(), residual.contiguous()
    rows, cols = fn._rows_cols(x, normalized_shape, "add_layer_norm")
    plan, file = _norms._fwd_plan(rows, cols, x) if rows and cols else (None, "")
    w = weight.contiguous() if weight is not None else x
    b = bias.contiguous() if bias is not None else x
    props, size = _launch.device_props(x.get_device()), x.element_size()
    aligned = _norms._aligned(x, residual, w, b)  # y and s are new: aligned
    two = _launch_norm.layer_norm_full2_plan(rows, cols, size, props) if aligned and file == "norm.cu" else None
    c4 = _launch_norm.norm_c4_plan(rows, cols, size, props, 2) if file == "norm.cu" else None
    if two is not None:  # as layer_norm: 16-bit rows of 2 to 4 KiB that fill 2 chunks a thread
        plan, name = two, "add_layer_norm_fwd_full<{T}, {A}>"
    elif c4 is not None:  # rows of 2 to 16 KiB in whole vectors: 4 chunks a thread
        plan, name = c4, "add_layer_norm_fwd_c4" + "_full" * _launch.full_rows(c4, cols, size, aligned, 4) + "<{T}, {A}>"
    elif file == "norm.cu":  # the other register rows: 2 chunks a thread
        name = "add_layer_norm_fwd" + "_full" * _launch.full_rows(plan, cols, size, aligned) + "<{T}, {A}>"
    elif rows and cols and (l2 := _norms._if_aligned(_launch_norm.add_layer_norm_l2_plan(rows, cols, size, props),
                                                     (x, residual, w, b))) is not None:
        # rows past the register strategy in whole 16-byte vectors: two passes, the second over s from L2
        plan, file, name = l2, "norm_l2.cu", _launch_norm.l2_kernel("add_layer_norm", l2)
    else:  # the long rows not in whole aligned vectors, or an empty input
        return _add_then_layer_norm(x, residual, normalized_shape, weight, bias, eps)
    file = "fused_norm.cu" if file == "norm.cu" else file
    y, s = torch.empty_like(x), torch.empty_like(x)
    mean = torch.empty(rows, dtype=fn._stats_dtype(x), device=x.device)
    rstd = torch.empty_like(mean)
    k = _sources.kernel(file, name, fn._dtype_name(x, "add_layer_norm"), x.get_device())
    k.launch(_launch.launch_config(plan), x, residual, w, b, y, s, mean, rstd, rows, cols, float(eps),
             int(weight is not None), int(bias is not None))
    return y, s, mean, rstd


def define_layer_norm(define, ln) -> list:
    """``add_layer_norm`` and its backward through ``define`` with autograd, over layer_norm's CPU
    code and fake kernels (``ln``: cpu, backward_cpu, fake, backward_fake, from ``_register``)."""
    cpu, backward_cpu, fake, backward_fake = ln

    def fake_fwd(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
        y, mean, rstd = fake(x, normalized_shape, weight, bias, eps)
        return y, x.new_empty(x.shape), mean, rstd

    def back_of(impl):
        def backward(grad, s, normalized_shape, mean, rstd, want_w, want_b, weight=None, grad_residual=None):
            ds, dw, db = impl(grad, s, normalized_shape, mean, rstd, want_w, want_b, weight)
            return (ds + grad_residual if grad_residual is not None else ds), dw, db
        return backward

    def back_cuda(grad, s, normalized_shape, mean, rstd, want_w, want_b, weight=None, grad_residual=None):
        return _norms.layer_norm_bwd(grad, s, normalized_shape, mean, rstd, want_w, want_b, weight, grad_residual)

    op = define("add_layer_norm", "(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight=None, "
                "Tensor? bias=None, float eps=1e-05) -> (Tensor, Tensor, Tensor, Tensor)", add_layer_norm_cuda,
                _add_layer_norm(cpu), fake_fwd)
    back = define("add_layer_norm_backward", "(Tensor grad, Tensor s, int[] normalized_shape, Tensor mean, "
                  "Tensor rstd, bool want_w, bool want_b, Tensor? weight=None, Tensor? grad_residual=None) "
                  "-> (Tensor, Tensor, Tensor)", back_cuda, back_of(backward_cpu),
                  back_of(backward_fake))

    def setup_context(ctx, inputs, output):
        _x, _residual, shape, weight, _bias, _eps = inputs
        _, s, mean, rstd = output
        ctx.mark_non_differentiable(mean, rstd)
        ctx.save_for_backward(s, mean, rstd, weight)
        ctx.shape = list(shape)

    def backward(ctx, gy, gs, _gmean, _grstd):
        import torch
        s, mean, rstd, weight = ctx.saved_tensors
        want_w = weight is not None and bool(ctx.needs_input_grad[4])  # [0] is the key set
        want_b = bool(ctx.needs_input_grad[5])
        if gy is None:
            gy = torch.zeros_like(s)
        ds, dw, db = back.default(gy, s, ctx.shape, mean, rstd, want_w, want_b, weight, gs)
        return ds, ds, None, (dw if want_w else None), (db if want_b else None), None

    op.register_autograd(backward, setup_context)
    return [op, back]
