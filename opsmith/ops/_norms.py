"""layer_norm and rms_norm on CUDA: the torch operators' implementations over norm.cu, norm_long.cu,
norm_cluster.cu, norm_l2.cu, norm_split.cu and norm_small.cu (the strategy from :mod:`opsmith.ops._launch`'s plans)."""
from __future__ import annotations

from opsmith.ops import _launch, _launch_bwd, _launch_norm
from opsmith.ops._functional import _kernel, _resident, _rows_cols, _stats_dtype

__all__ = ["layer_norm_fwd", "layer_norm_bwd", "rms_norm_fwd", "rms_norm_bwd"]

_CL = "norm_cluster.cu"
_L2 = "norm_l2.cu"


def layer_norm_fwd(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """(y, mean, rstd) of layer norm over the last ``len(normalized_shape)`` dims (CUDA)."""
    import torch
    x = x.contiguous()
    rows, cols = _rows_cols(x, normalized_shape, "layer_norm")
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=_stats_dtype(x), device=x.device)
    rstd = torch.empty_like(mean)
    if rows and cols:
        w = weight.contiguous() if weight is not None else x
        b = bias.contiguous() if bias is not None else x
        plan, file = _fwd_plan(rows, cols, x)
        args = (x, w, b, y, mean, rstd, rows, cols, float(eps), int(weight is not None), int(bias is not None))
        props = _launch.device_props(x.get_device())
        c4 = _launch_norm.norm_c4_plan(rows, cols, x.element_size(), props, 2)
        aligned = _aligned(x, w, b, y)
        two = _launch_norm.layer_norm_full2_plan(rows, cols, x.element_size(), props) if aligned else None
        if two is not None:  # 16-bit rows of 2 to 4 KiB that fill 2 chunks a thread: the unchecked row alone
            _kernel("norm.cu", "layer_norm_fwd_full<{T}, {A}>", x).launch(_launch.launch_config(two), *args)
        elif c4 is not None:  # rows of 2 to 16 KiB: 4 chunks a thread (the unchecked row alone where it fills them)
            full = _launch.full_rows(c4, cols, x.element_size(), aligned, 4)
            _kernel("norm.cu", f"layer_norm_fwd_c4{'_full' * full}<{{T}}, {{A}}>", x).launch(
                _launch.launch_config(c4), *args)
        elif (c8 := _c8_plan(rows, cols, props, x, w, b, y)) is not None:  # 16 to 32 KiB: 8 chunks, one pass
            _kernel("norm.cu", "layer_norm_fwd_c8<{T}, {A}>", x).launch(_launch.launch_config(c8), *args)
        elif (l2 := _l2_plan(rows, cols, props, 2, x, w, b, y)) is not None:  # longer rows: 2 passes, the 2nd from L2
            _kernel(_L2, _launch_norm.l2_kernel("layer_norm", l2), x).launch(_launch.launch_config(l2), *args)
        elif (four := _launch_norm.layer_norm_fwd4_plan(rows, cols, x.element_size(), props)) is not None:
            # float rows of 4,097-8,192: one block, 4 chunks a thread
            _kernel("norm.cu", "layer_norm_fwd4<{T}, {A}>", x).launch(_launch.launch_config(four), *args)
        elif file == _CL:
            k = _kernel(_CL, f"layer_norm_fwd_cluster<{plan.cluster}, {plan.chunks}, {{T}}, {{A}}>", x)
            k.launch(_launch.launch_config(_resident(k, plan)), *args)
        elif plan.strategy == "long":
            _kernel("norm_long.cu", "layer_norm_fwd_long<{T}, {A}>", x).launch(_launch.launch_config(plan), *args, plan.cache)
        else:
            vec = cols % (16 // x.element_size()) == 0 and all(t.data_ptr() % 16 == 0 for t in (x, w, b, y))
            name = _launch_norm.layer_norm_kernel(plan, vec)
            _kernel("norm.cu", name + "<{T}, {A}>", x).launch(_launch.launch_config(plan), *args)
    return y, mean, rstd


def _col_sums(x, part_w, part_b, cols: int, shape):
    """The weight (and bias) gradients from partial sums (rows of ``cols`` in the stats' dtype),
    added up by norm_col_sum in one launch and rounded to x's dtype; None where not given."""
    import torch
    dw = torch.empty(shape, dtype=x.dtype, device=x.device) if part_w is not None else None
    db = torch.empty(shape, dtype=x.dtype, device=x.device) if part_b is not None else None
    first, second = (part_w, dw) if part_w is not None else (part_b, db)
    both = part_w is not None and part_b is not None
    plan = _launch_bwd.col_sum_plan(cols, 2 if both else 1)
    _kernel("norm_split.cu", "norm_col_sum<{T}, {A}>", x).launch(
        _launch.launch_config(plan), first, part_b if both else first, second, db if both else second,
        first.shape[0], cols)
    return dw, db


def _weight_grads(g, x, mean, rstd, rows: int, cols: int, want_w: bool, want_b: bool, shape):
    """(grad_w, grad_b) after a backward that left them out (long rows, ``"split"`` plans):
    norm_bwd_weight over grad_y and x again, in one chunk straight to the gradients, else partial
    sums per chunk of rows and norm_col_sum (sm_90+, ``"cluster"`` plans: norm_bwd_weight_cluster, a
    cluster's chunks added up through distributed shared memory); None where not wanted."""
    import torch
    plan, per_chunk = _launch_bwd.weight_grad_plan(rows, cols, x.element_size(), _launch.device_props(x.get_device()))
    dw = torch.empty(shape, dtype=x.dtype, device=x.device) if want_w else None
    db = torch.empty(shape, dtype=x.dtype, device=x.device) if want_b else None
    if plan.strategy == "cluster":  # sm_90+: a cluster of chunks adds its sums up itself, straight to the gradients
        _kernel("norm_split.cu", "norm_bwd_weight_cluster<{T}, {A}>", x).launch(
            _launch.launch_config(plan), g, x, mean if mean is not None else rstd, rstd, _or(dw, x), _or(db, x), rows,
            cols, per_chunk, int(mean is not None), int(want_w), int(want_b))
        return dw, db
    chunks = plan.grid[1]
    pw = torch.empty((chunks, cols), dtype=rstd.dtype, device=x.device) if want_w and chunks > 1 else None
    pb = torch.empty((chunks, cols), dtype=rstd.dtype, device=x.device) if want_b and chunks > 1 else None
    _kernel("norm_split.cu", "norm_bwd_weight<{T}, {A}>", x).launch(
        _launch.launch_config(plan), g, x, mean if mean is not None else rstd, rstd, _or(pw, rstd), _or(pb, rstd),
        _or(dw, x), _or(db, x), rows, cols, per_chunk, int(mean is not None), int(want_w), int(want_b))
    return (dw, db) if chunks == 1 else _col_sums(x, pw, pb, cols, shape)


def _new_grad(x, shape, written: bool, other):
    """An empty weight (or bias) gradient of ``shape`` in x's dtype for a kernel to write into, where
    ``written``; else ``other``."""
    import torch
    return torch.empty(shape, dtype=x.dtype, device=x.device) if written else other


def _or(t, other):
    return t if t is not None else other


def _partials(plan, cols: int, rstd, wanted: bool):
    """A persistent norm backward's partial sums of one gradient: a row of ``cols`` a block (a
    cluster: ``plan.cluster`` blocks), in the stats' dtype (norm_col_sum adds the rows up);
    ``rstd`` itself, unread, where not wanted."""
    import torch
    prows = plan.grid[0] // plan.cluster
    return torch.empty((prows, cols), dtype=rstd.dtype, device=rstd.device) if wanted else rstd


def _l2_plan(rows: int, cols: int, props, arrays: int, *tensors):
    """``_launch_norm.norm_l2_plan``'s plan (``arrays``: 2 layer_norm, 1 rms_norm and add_rms_norm) where
    every one of ``tensors`` is 16-byte aligned, else None."""
    return _if_aligned(_launch_norm.norm_l2_plan(rows, cols, tensors[0].element_size(), props, arrays), tensors)


def _c8_plan(rows: int, cols: int, props, *tensors):
    """``_launch_norm.norm_c8_plan``'s plan where every one of ``tensors`` is 16-byte aligned, else None."""
    return _if_aligned(_launch_norm.norm_c8_plan(rows, cols, tensors[0].element_size(), props), tensors)


def _aligned(*tensors) -> bool:
    """Whether every one of ``tensors`` starts 16-byte aligned."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _if_aligned(plan, tensors):
    """``plan`` where there is one and every one of ``tensors`` is 16-byte aligned (the L2 and 8-chunk rows' kernels
    take whole 16-byte vectors), else None."""
    return plan if plan is not None and _aligned(*tensors) else None


def _fwd_plan(rows: int, cols: int, x):
    """The forward's plan (``_launch_norm.norm_fwd_plan``) and kernel file: the register rows (norm.cu), the
    clusters (norm_cluster.cu) or the long rows (norm_long.cu); add_rms_norm's too (_fused)."""
    plan = _launch_norm.norm_fwd_plan(rows, cols, x.element_size(), _launch.device_props(x.get_device()))
    return plan, {"cluster": _CL, "long": "norm_long.cu"}.get(plan.strategy, "norm.cu")


def _bwd_plan(rows: int, cols: int, x, arrays: int, *tensors):
    """The backward's plan and kernel file: the persistent register rows (norm.cu; at 4 chunks a thread, ``"c4"``,
    and at two blocks an SM, ``"sm"``, where every one of ``tensors`` is 16-byte aligned; ``"split"``: norm_split.cu,
    the callers launch it), the clusters (norm_cluster.cu) or the long rows (norm_long.cu); ``arrays``: the weight
    gradients the op has (2 layer_norm, 1 rms_norm)."""
    props = _launch.device_props(x.get_device())
    for shared in (_launch_bwd.norm_bwd_c4_plan, _launch_bwd.norm_bwd_sm_plan):  # the sums in shared memory
        plan = _if_aligned(shared(rows, cols, x.element_size(), props, arrays), tensors)
        if plan is not None:
            return plan, "norm.cu"
    plan = _launch_bwd.norm_bwd_plan(rows, cols, x.element_size(), props, arrays)
    if plan.strategy != "long":
        return plan, "norm.cu"
    cluster = _launch_norm.norm_cluster_plan(rows, cols, x.element_size(), props, True)
    return (cluster, _CL) if cluster is not None else (plan, "norm_long.cu")


def layer_norm_bwd(grad_y, x, normalized_shape, mean, rstd, want_w: bool, want_b: bool, weight=None,
                   grad_residual=None):
    """(grad_x, grad_weight, grad_bias) of layer norm (CUDA); an empty tensor where not wanted.
    ``grad_residual`` (add_layer_norm's): added to grad_x by the kernel itself (the ``*_res`` kernels) on the
    persistent register rows, the clusters and the long rows; after the small and split backwards."""
    res = grad_residual.contiguous().to(x.dtype) if grad_residual is not None else None
    dx, dw, db, added = _layer_norm_bwd(grad_y, x, normalized_shape, mean, rstd, want_w, want_b, weight, res)
    if res is not None and not added:
        dx.add_(res)
    return dx, dw, db


def _layer_norm_bwd(grad_y, x, normalized_shape, mean, rstd, want_w: bool, want_b: bool, weight, res):
    """layer_norm_bwd's kernels: (grad_x, grad_weight, grad_bias, whether ``res`` is in grad_x)."""
    import torch
    x = x.contiguous()
    g = grad_y.contiguous().to(x.dtype)
    rows, cols = _rows_cols(x, normalized_shape, "layer_norm")
    dx = torch.empty_like(x)
    shape = tuple(normalized_shape)
    none = x.new_empty(0)
    if not (rows and cols):
        z = torch.zeros(shape, dtype=x.dtype, device=x.device)
        return dx, (z if want_w else none), (z.clone() if want_b else none.clone()), False
    w = weight.contiguous() if weight is not None else x
    dw, db = none, none.clone()
    small = _launch_bwd.norm_bwd_small_plan(rows, cols, x.element_size(), _launch.device_props(x.get_device()))
    if small is not None:  # few rows: grad_x and the weight and bias gradients in one launch
        dw, db = _new_grad(x, shape, want_w, dw), _new_grad(x, shape, want_b, db)
        _kernel("norm_small.cu", "layer_norm_bwd_small<{T}, {A}>", x).launch(
            _launch.launch_config(small), g, x, w, mean, rstd, dx, dw if want_w else x, db if want_b else x, rows,
            cols, int(weight is not None), int(want_w), int(want_b), small.chunks)
        return dx, dw, db, False
    plan, file = _bwd_plan(rows, cols, x, 2, g, x, w, dx, *((res,) if res is not None else ()))
    if plan.strategy in ("long", "split"):  # grad_x alone, then the weight and bias gradients (norm_bwd_weight)
        args = (g, x, w, mean, rstd, dx, rows, cols, int(weight is not None))
        added = plan.strategy == "long" and res is not None  # the residual's gradient added by the long kernel
        if plan.strategy == "long":
            name = "layer_norm_bwd_long_res<{T}, {A}>" if added else "layer_norm_bwd_long<{T}, {A}>"
            _kernel("norm_long.cu", name, x).launch(_launch.launch_config(plan), *args, plan.cache, *((res,) * added))
        else:  # one row: its weight and bias gradients are elementwise, written by the same kernel
            one_w, one_b = rows == 1 and want_w, rows == 1 and want_b
            dw, db = _new_grad(x, shape, one_w, dw), _new_grad(x, shape, one_b, db)
            _kernel("norm_split.cu", "layer_norm_bwd_dx<{T}, {A}>", x).launch(
                _launch.launch_config(plan), *args, dw if one_w else x, db if one_b else x, int(one_w), int(one_b))
            if rows == 1:
                return dx, dw, db, False
        if want_w or want_b:
            sw, sb = _weight_grads(g, x, mean, rstd, rows, cols, want_w, want_b, shape)
            dw, db = (sw if want_w else dw), (sb if want_b else db)
        return dx, dw, db, added
    # the weight and bias gradients come out of the same kernel: one row of partial sums a block, or with
    # one block (norm.cu's), the gradients themselves
    direct = file != _CL and plan.grid[0] == 1
    fused = res is not None  # the residual's gradient added by the kernel
    c4 = {"c4": "_c4", "sm": "_sm"}.get(plan.strategy, "")
    name = (f"layer_norm_bwd_cluster{'_res' * fused}<{plan.cluster}, {{T}}, {{A}}>" if file == _CL
            else f"layer_norm_bwd{c4}{'_res' * fused}<{{T}}, {{A}}>")
    k = _kernel(file, name, x)
    plan = _resident(k, plan)
    pw, pb = _partials(plan, cols, rstd, want_w and not direct), _partials(plan, cols, rstd, want_b and not direct)
    dw, db = _new_grad(x, shape, direct and want_w, dw), _new_grad(x, shape, direct and want_b, db)
    extra = (() if file == _CL else (dw if direct and want_w else x, db if direct and want_b else x, int(direct))) \
        + ((res,) if fused else ())
    k.launch(
        _launch.launch_config(plan), g, x, w, mean, rstd, dx, pw, pb, rows, cols, int(weight is not None),
        int(want_w), int(want_b), *extra)
    if direct:
        return dx, dw, db, fused
    if want_w or want_b:
        sw, sb = _col_sums(x, pw if want_w else None, pb if want_b else None, cols, shape)
        dw = sw if want_w else dw
        db = sb if want_b else db
    return dx, dw, db, fused


def rms_norm_fwd(x, normalized_shape, weight=None, eps: float | None = None):
    """(y, rstd) of RMS norm (CUDA); ``eps=None``: the dtype's machine epsilon, as torch."""
    import torch
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    x = x.contiguous()
    rows, cols = _rows_cols(x, normalized_shape, "rms_norm")
    y = torch.empty_like(x)
    rstd = torch.empty(rows, dtype=_stats_dtype(x), device=x.device)
    if rows and cols:
        w = weight.contiguous() if weight is not None else x
        plan, file = _fwd_plan(rows, cols, x)
        args = (x, w, y, rstd, rows, cols, float(eps), int(weight is not None))
        props = _launch.device_props(x.get_device())
        c4 = _launch_norm.norm_c4_plan(rows, cols, x.element_size(), props, 1)
        if c4 is not None:  # 16-bit rows of 2 to 16 KiB: 4 chunks a thread (full rows: the unchecked row alone)
            full = _launch.full_rows(c4, cols, x.element_size(), _aligned(x, w, y), 4)
            _kernel("norm.cu", f"rms_norm_fwd_c4{'_full' * full}<{{T}}, {{A}}>", x).launch(
                _launch.launch_config(c4), *args)
        elif (c8 := _c8_plan(rows, cols, props, x, w, y)) is not None:  # 16 to 32 KiB: 8 chunks, one pass
            _kernel("norm.cu", "rms_norm_fwd_c8<{T}, {A}>", x).launch(_launch.launch_config(c8), *args)
        elif (l2 := _l2_plan(rows, cols, props, 1, x, w, y)) is not None:  # longer (float: from 16 KiB): 2 passes
            _kernel(_L2, _launch_norm.l2_kernel("rms_norm", l2), x).launch(_launch.launch_config(l2), *args)
        elif file == _CL:
            k = _kernel(_CL, f"rms_norm_fwd_cluster<{plan.cluster}, {plan.chunks}, {{T}}, {{A}}>", x)
            k.launch(_launch.launch_config(_resident(k, plan)), *args)
        elif plan.strategy == "long":
            _kernel("norm_long.cu", "rms_norm_fwd_long<{T}, {A}>", x).launch(_launch.launch_config(plan), *args, plan.cache)
        else:
            _kernel("norm.cu", "rms_norm_fwd<{T}, {A}>", x).launch(_launch.launch_config(plan), *args)
    return y, rstd


def rms_norm_bwd(grad_y, x, normalized_shape, rstd, want_w: bool, weight=None, grad_residual=None):
    """(grad_x, grad_weight) of RMS norm (CUDA); an empty tensor where not wanted.
    ``grad_residual`` (add_rms_norm's): added to grad_x, in the same kernel where the row fits in
    registers."""
    import torch
    x = x.contiguous()
    g = grad_y.contiguous().to(x.dtype)
    rows, cols = _rows_cols(x, normalized_shape, "rms_norm")
    dx = torch.empty_like(x)
    shape = tuple(normalized_shape)
    res = grad_residual.contiguous().to(x.dtype) if grad_residual is not None else None
    if not (rows and cols):
        return dx, (torch.zeros(shape, dtype=x.dtype, device=x.device) if want_w else x.new_empty(0))
    w = weight.contiguous() if weight is not None else x
    small = _launch_bwd.norm_bwd_small_plan(rows, cols, x.element_size(), _launch.device_props(x.get_device()))
    if small is not None:  # few rows: grad_x and the weight gradient in one launch
        dw = _new_grad(x, shape, want_w, None)
        _kernel("norm_small.cu", "rms_norm_bwd_small<{T}, {A}>", x).launch(
            _launch.launch_config(small), g, x, w, rstd, dx, _or(dw, x), rows, cols, int(weight is not None),
            int(want_w), res if res is not None else x, int(res is not None), small.chunks)
        return dx, dw if want_w else x.new_empty(0)
    plan, file = _bwd_plan(rows, cols, x, 1, g, x, w, dx, *((res,) if res is not None else ()))
    if plan.strategy in ("long", "split"):  # grad_x alone, then the weight gradient (norm_bwd_weight)
        args = (g, x, w, rstd, dx, rows, cols, int(weight is not None))
        if plan.strategy == "long":  # the residual's gradient added after
            _kernel("norm_long.cu", "rms_norm_bwd_long<{T}, {A}>", x).launch(_launch.launch_config(plan), *args,
                                                                             plan.cache)
            if res is not None:
                dx.add_(res)
        else:
            one = rows == 1 and want_w  # one row: its weight gradient is elementwise, written by the same kernel
            dw = _new_grad(x, shape, one, None)
            _kernel("norm_split.cu", "rms_norm_bwd_dx<{T}, {A}>", x).launch(
                _launch.launch_config(plan), *args, res if res is not None else x, int(res is not None), _or(dw, x),
                int(one))
            if one:
                return dx, dw
        return dx, (_weight_grads(g, x, None, rstd, rows, cols, True, False, shape)[0] if want_w
                    else x.new_empty(0))
    direct = file != _CL and plan.grid[0] == 1 and want_w  # one block (norm.cu's): the gradient itself
    c4 = {"c4": "_c4", "sm": "_sm"}.get(plan.strategy, "")
    name = f"rms_norm_bwd_cluster<{plan.cluster}, {{T}}, {{A}}>" if file == _CL else f"rms_norm_bwd{c4}<{{T}}, {{A}}>"
    k = _kernel(file, name, x)
    plan = _resident(k, plan)
    pw = _partials(plan, cols, rstd, want_w and not direct)
    dw = _new_grad(x, shape, direct, None)
    k.launch(
        _launch.launch_config(plan), g, x, w, rstd, dx, pw, rows, cols, int(weight is not None), int(want_w),
        res if res is not None else x, int(res is not None), *(() if file == _CL else (_or(dw, x), int(direct))))
    if not want_w:
        return dx, x.new_empty(0)
    return dx, dw if direct else _col_sums(x, pw, None, cols, shape)[0]
