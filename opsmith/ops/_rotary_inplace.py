"""Rotary position embedding in place: ``rotary_embedding_`` and ``rotary_embedding_qk_``.

=========================  =================================================================
``rotary_embedding_``      ``(Tensor(a!) x, Tensor cos, Tensor sin, Tensor? positions=None,
                           bool interleaved=False) -> ()``: ``x`` rotated where it lies
``rotary_embedding_qk_``   ``(Tensor(a!) q, Tensor(b!) k, <the same>) -> ()``: both, one launch
=========================  =================================================================

The arguments are :mod:`opsmith.ops._rotary`'s. ``x`` is written where it lies when it is contiguous or a permuted
contiguous tensor (``kernels/rotary_ip.cu``: one pointer read and written, the dims beyond the rotary ones not
touched); any other ``x`` (a slice of a packed ``qkv``: rows with gaps) is rotated out of place and copied back. q and
k that certainly share elements are refused. The ops have no autograd formula (torch gives a mutating operator
none): :func:`rotate_inplace` records one through an ``autograd.Function`` (``mark_dirty``), the gradient being the
out-of-place inverse rotation; called directly on a tensor that requires grad, they raise.
"""
from __future__ import annotations

from opsmith._errors import SpecError
from opsmith.ops import _functional as fn
from opsmith.ops import _launch, _sources
from opsmith.ops import _rotary as R

__all__ = ["define_inplace", "rotary_inplace_cuda", "rotary_qk_inplace_cuda", "rotate_inplace", "rotate_qk_inplace"]


def _writable(x, where: str) -> None:
    """A SpecError where writing ``x`` in place would write one element twice (an expanded view)."""
    for i, (size, stride) in enumerate(zip(x.shape, x.stride())):
        if size > 1 and stride == 0:
            raise SpecError(f"opsmith.ops.{where}: x is an expanded view (stride 0 along dim {i}), so rotating it in "
                            f"place would write one element many times; pass x.clone() or inplace=False")


def _dense_rows(x) -> bool:
    """Can the in-place kernels write ``x`` where it lies (contiguous, or a permuted contiguous tensor)?"""
    return x.is_contiguous() or R._memory_order(x) is not None


def rotary_inplace_cuda(x, cos, sin, positions=None, interleaved: bool = False, sign: int = 1) -> None:
    """The rotation of ``x`` written over ``x`` on CUDA: in place where its rows are dense, else out of place and
    copied back."""
    _writable(x, "rotary_embedding")
    half, full, order, lead = R._checked(x, cos, sin, positions, interleaved)
    if order is None and not x.is_contiguous():
        x.copy_(R.rotary_cuda(x, cos, sin, positions, interleaved, sign))
        return
    d = x.shape[-1]
    rows = x.numel() // d if d else 0
    if not rows:
        return
    xk = x if order is None else x.permute(*order, x.dim() - 1)
    cos, sin, pos = R._tables(x, cos, sin, positions)
    dt = fn._dtype_name(x, "rotary_embedding")
    plan = R.plan_one(x, rows, half, full, dt)
    k = _sources.kernel("rotary_ip.cu", "rotary_ip_full<{T}>" if full else "rotary_ip<{T}>", dt, x.get_device())
    k.launch(_launch.launch_config(plan), xk, cos, sin, pos, rows, d, half, int(interleaved), sign,
             int(positions is not None), *lead)


def _overlap(a, b) -> bool:
    """Do ``a`` and ``b`` certainly share elements? The same first element, or two tensors with dense rows (whose
    elements fill the bytes from their first to their last) whose bytes meet. Views with gaps whose spans interleave
    (q and k of a packed qkv) count as apart, as torch's own overlap check leaves them."""
    if a.numel() == 0 or b.numel() == 0 or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    if a.data_ptr() == b.data_ptr():
        return True
    if not (_dense_rows(a) and _dense_rows(b)):
        return False
    span = [(t.data_ptr(), t.data_ptr() + t.element_size() * t.numel()) for t in (a, b)]
    return span[0][0] < span[1][1] and span[1][0] < span[0][1]


def _check_qk_inplace(q, k) -> None:
    R.check_qk(q, k)
    if _overlap(q, k):
        raise SpecError("opsmith.ops.rotary_embedding_qk: in place, q and k must not share memory (the same tensor "
                        "twice, or views that overlap): each element would be rotated twice; pass inplace=False")


def rotary_qk_inplace_cuda(q, k, cos, sin, positions=None, interleaved: bool = False, sign: int = 1) -> None:
    """Both rotations written over ``q`` and ``k`` in one launch where both have dense rows (else one at a time,
    :func:`rotary_inplace_cuda`)."""
    _check_qk_inplace(q, k)
    _writable(q, "rotary_embedding_qk")
    _writable(k, "rotary_embedding_qk")
    if not (_dense_rows(q) and _dense_rows(k)) or not q.numel() or not k.numel():
        rotary_inplace_cuda(q, cos, sin, positions, interleaved, sign)  # one at a time (a view with gaps: out of
        rotary_inplace_cuda(k, cos, sin, positions, interleaved, sign)  # place, copied back)
        return
    half, full, order_q, lead_q = R._checked(q, cos, sin, positions, interleaved)
    _, _, order_k, lead_k = R._checked(k, cos, sin, positions, interleaved)
    d = q.shape[-1]
    rows_q, rows_k = q.numel() // d, k.numel() // d
    qk_ = q if order_q is None else q.permute(*order_q, q.dim() - 1)
    kk = k if order_k is None else k.permute(*order_k, k.dim() - 1)
    cos, sin, pos = R._tables(q, cos, sin, positions)
    dt = fn._dtype_name(q, "rotary_embedding_qk")
    plan = R.plan_qk(q, rows_q, rows_k, half, full, dt, lead_q)
    kern = _sources.kernel("rotary_ip.cu", "rotary_qk_ip_full<{T}>" if full else "rotary_qk_ip<{T}>", dt, q.get_device())
    kern.launch(_launch.launch_config(plan), qk_, kk, cos, sin, pos, rows_q, rows_k, d, half, int(interleaved), sign,
                int(positions is not None), *lead_q, *lead_k)



_inplace_lib: list = []  # the Library that defines rotary_embedding_ and rotary_embedding_qk_, kept alive


def _written(name: str, *tensors) -> None:
    """Before an in-place kernel writes ``tensors``: a SpecError where autograd would miss the write (a tensor that
    requires grad, grad mode on: these ops have no formula of their own), then their version counters bumped as
    torch's in-place ops bump them (a tensor saved for a backward and written since is caught there)."""
    import torch
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise SpecError(f"torch.ops.opsmith.{name} has no autograd formula, and its input requires grad: call "
                        f"opsmith.ops.{name[:-1]}(..., inplace=True), which records the inverse rotation as the "
                        f"gradient, or run it under torch.no_grad()")
    for t in tensors:
        if not t.is_inference():
            torch.autograd.graph.increment_version(t)


def define_inplace() -> list:
    """``rotary_embedding_`` and ``rotary_embedding_qk_``: torch operators that write their tensors (``Tensor(a!)``;
    under ``torch.compile`` torch's functionalization makes out-of-place ones of them); returns both overloads.
    Defined on a ``torch.library.Library`` with CPU and CUDA kernels that bump the written tensors' versions
    themselves: ``torch.library.custom_op`` with ``mutates_args`` does it through Python kernels of its own on the
    ADInplaceOrView and Autograd keys, 12 us more a call on the 2-core CPU machine."""
    import torch
    args = "Tensor cos, Tensor sin, Tensor? positions=None, bool interleaved=False"

    def cpu(x, cos, sin, positions=None, interleaved=False):
        _writable(x, "rotary_embedding")
        _written("rotary_embedding_", x)
        x.copy_(R._cpu(x, cos, sin, positions, interleaved, 1))

    def cpu_qk(q, k, cos, sin, positions=None, interleaved=False):
        _check_qk_inplace(q, k)
        _written("rotary_embedding_qk_", q, k)
        for t in (q, k):
            _writable(t, "rotary_embedding_qk")
            t.copy_(R._cpu(t, cos, sin, positions, interleaved, 1))

    def cuda(x, cos, sin, positions=None, interleaved=False):
        _written("rotary_embedding_", x)
        rotary_inplace_cuda(x, cos, sin, positions, interleaved, 1)

    def cuda_qk(q, k, cos, sin, positions=None, interleaved=False):
        _written("rotary_embedding_qk_", q, k)
        rotary_qk_inplace_cuda(q, k, cos, sin, positions, interleaved, 1)

    def fake(x, cos, sin, positions=None, interleaved=False):
        R.check(x, cos, sin, positions, interleaved)

    def fake_qk(q, k, cos, sin, positions=None, interleaved=False):
        R.check_qk(q, k)
        R.check(q, cos, sin, positions, interleaved)

    lib = torch.library.Library("opsmith", "FRAGMENT")
    lib.define(f"rotary_embedding_(Tensor(a!) x, {args}) -> ()")
    lib.define(f"rotary_embedding_qk_(Tensor(a!) q, Tensor(b!) k, {args}) -> ()")
    for name, c, g, f in (("rotary_embedding_", cpu, cuda, fake), ("rotary_embedding_qk_", cpu_qk, cuda_qk, fake_qk)):
        lib.impl(name, c, "CPU")
        lib.impl(name, g, "CUDA")
        torch.library.register_fake(f"opsmith::{name}", f, lib=lib)
    _inplace_lib.append(lib)
    return [torch.ops.opsmith.rotary_embedding_.default, torch.ops.opsmith.rotary_embedding_qk_.default]


_inplace_fns: list = []  # the autograd.Function of the in-place rotations, made on first use


def _functions():
    """The autograd.Functions of the in-place rotations (one tensor; q and k): the forward writes the inputs
    (``mark_dirty``), the backward is the out-of-place inverse rotation."""
    if _inplace_fns:
        return _inplace_fns
    import torch
    ops = lambda: torch.ops.opsmith  # noqa: E731  (registered: the public functions looked their op up first)

    class RotaryInplace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin, positions, interleaved):
            ops().rotary_embedding_.default(x, cos, sin, positions, interleaved)
            ctx.mark_dirty(x)
            ctx.save_for_backward(cos, sin, positions)
            ctx.interleaved = interleaved
            return x

        @staticmethod
        def backward(ctx, grad):
            R._no_table_grads(ctx, 1)
            cos, sin, positions = ctx.saved_tensors
            return ops().rotary_embedding_backward(grad, cos, sin, positions, ctx.interleaved), None, None, None, None

    class RotaryQKInplace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, cos, sin, positions, interleaved):
            ops().rotary_embedding_qk_.default(q, k, cos, sin, positions, interleaved)
            ctx.mark_dirty(q, k)
            ctx.save_for_backward(cos, sin, positions)
            ctx.interleaved = interleaved
            return q, k

        @staticmethod
        def backward(ctx, grad_q, grad_k):
            R._no_table_grads(ctx, 2)
            cos, sin, positions = ctx.saved_tensors
            back = ops().rotary_embedding_backward
            return (*[None if g is None else back(g, cos, sin, positions, ctx.interleaved) for g in (grad_q, grad_k)],
                    None, None, None, None)

    _inplace_fns[:] = [RotaryInplace, RotaryQKInplace]
    return _inplace_fns


def _needs_graph(tensors, where: str) -> bool:
    """Does autograd record the in-place rotation of ``tensors``? A SpecError for a leaf that requires grad (torch
    forbids writing one in place)."""
    import torch
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return False
    for t in tensors:
        if t.requires_grad and t.is_leaf:
            raise SpecError(f"opsmith.ops.{where}: inplace=True on a leaf tensor that requires grad (a parameter, or "
                            f"a tensor made with requires_grad=True): torch forbids writing it in place; pass "
                            f"inplace=False, or rotate the output of an op (x = proj(h)) in place")
    return True


def rotate_inplace(x, cos, sin, positions, interleaved: bool, call):
    """``x`` rotated in place and returned, with autograd where ``x`` requires grad; ``call``: what runs
    ``rotary_embedding_`` without autograd (the public functions' ``_call``: the builtin in eager mode)."""
    if _needs_graph((x,), "rotary_embedding"):
        return _functions()[0].apply(x, cos, sin, positions, interleaved)
    call(x, cos, sin, positions, interleaved)
    return x


def rotate_qk_inplace(q, k, cos, sin, positions, interleaved: bool, call):
    """``(q, k)`` rotated in place and returned, with autograd where either requires grad (``call``: as
    :func:`rotate_inplace`'s, of ``rotary_embedding_qk_``)."""
    if _needs_graph((q, k), "rotary_embedding_qk"):
        return _functions()[1].apply(q, k, cos, sin, positions, interleaved)
    call(q, k, cos, sin, positions, interleaved)
    return q, k
