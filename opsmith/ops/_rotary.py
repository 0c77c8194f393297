"""Rotary position embedding as torch operators: ``rotary_embedding`` and its backward.

=========================  =================================================================
``rotary_embedding``       ``(Tensor x, Tensor cos, Tensor sin, Tensor? positions=None,
                           bool interleaved=False) -> Tensor``
``rotary_embedding_backward``  the same arguments with ``grad`` first: the inverse rotation
``rotary_embedding_qk``    ``(Tensor q, Tensor k, <the same>) -> (Tensor, Tensor)``: both
                           rotated by one table in one launch (``k`` may have fewer heads)
``rotary_embedding_qk_backward``  ``(Tensor grad_q, Tensor grad_k, <the same>)``
``rotary_embedding_``      ``(Tensor(a!) x, <the same>) -> ()``: ``x`` rotated in place
``rotary_embedding_qk_``   ``(Tensor(a!) q, Tensor(b!) k, <the same>) -> ()``: both, one launch
=========================  =================================================================

``x`` is ``[..., d]`` (at most 4 leading dims, e.g. ``[batch, heads, seq, head_dim]``); each
row's first ``2 * half`` elements are rotated in pairs, neox layout ``(j, j + half)`` or
interleaved (GPT-J) ``(2j, 2j + 1)``, the rest copied. ``cos``/``sin`` end in ``half`` and
broadcast against ``x.shape[:-1]``; with ``positions`` (int64, broadcast against
``x.shape[:-1]``) they are tables ``[max_position, half]`` indexed by each row's position.
Neox tables may also be full width, ending in ``d`` as transformers builds them
(``cat(freqs, freqs)``): the pair's first element then turns by the first half's angles and
the second by the second half's, ``x * cos + rotate_half(x) * sin`` exactly, whatever the halves
hold. Their gradients are not computed. The output has ``x``'s layout where ``x`` is a permuted
dense tensor with a unit last stride (``q.transpose(1, 2)``: no copy), else it is contiguous.
The CUDA code (``kernels/rotary.cu``) is Python-launched on every machine.

In place: :mod:`opsmith.ops._rotary_inplace`.
"""
from __future__ import annotations

import functools

from opsmith._errors import SpecError
from opsmith.ops import _functional as fn
from opsmith.ops import _launch, _sources

__all__ = ["check", "check_qk", "define_all", "lean", "out_like", "rotary_cuda", "rotary_qk_cuda"]

MAX_LEAD = 4


def check(x, cos, sin, positions, interleaved: bool = False) -> tuple[int, bool]:
    """``(half, full)`` after checking the arguments (a SpecError that names the fix); ``full``:
    neox tables as wide as ``x``'s rows, the second half's angles for the pairs' second elements."""
    where = "opsmith.ops.rotary_embedding"
    if x.dim() < 1 or x.dim() - 1 > MAX_LEAD:
        raise SpecError(f"{where}: x must have 1 to {MAX_LEAD + 1} dims ([..., head_dim]), got shape {tuple(x.shape)}")
    if cos.shape != sin.shape or cos.dim() < 1:
        raise SpecError(f"{where}: cos and sin must have one shape ending in half the rotary dim, got "
                        f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    half, full = cos.shape[-1], cos.shape[-1] == x.shape[-1] and x.shape[-1] % 2 == 0
    if full and interleaved:
        raise SpecError(f"{where}: full-width cos/sin tables ({half} = x.shape[-1]) are for the neox layout; for "
                        f"interleaved pairs pass one angle a pair: cos[..., ::2], sin[..., ::2]")
    if full:
        half //= 2
    if 2 * half > x.shape[-1] or half < 1:
        raise SpecError(f"{where}: cos/sin's last dim ({half}) is half the rotary dim, which must be 1 .. "
                        f"x.shape[-1] // 2 = {x.shape[-1] // 2} (or x.shape[-1], full neox tables)")
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise SpecError(f"{where}: cos/sin are {cos.dtype}, x is {x.dtype}; convert them with .to(x.dtype)")
    if positions is not None:
        if positions.dtype.is_floating_point or positions.dtype.is_complex:
            raise SpecError(f"{where}: positions must be integers (torch.long), got {positions.dtype}")
        if cos.dim() != 2:
            raise SpecError(f"{where}: with positions, cos/sin are tables [max_position, half], got {tuple(cos.shape)}")
    import torch
    lead, rows_of = tuple(x.shape[:-1]), (positions.shape if positions is not None else cos.shape[:-1])
    try:
        fits = torch.broadcast_shapes(tuple(rows_of), lead) == lead
    except RuntimeError:
        fits = False
    if not fits:
        what = "positions" if positions is not None else "cos/sin's leading dims"
        raise SpecError(f"{where}: {what} {tuple(rows_of)} must broadcast against x's leading dims {lead} "
                        f"(right-aligned: for x [batch, heads, seq, head_dim] use [seq, ...] or [batch, 1, seq, ...])")
    return half, full


def _lead_strides(t, lead, what: str) -> tuple:
    """The strides of ``t`` broadcast to ``lead`` (0 where broadcast), or a SpecError."""
    try:
        return t.expand(*lead).stride() if lead else ()
    except RuntimeError:
        raise SpecError(f"opsmith.ops.rotary_embedding: {what} of shape {tuple(t.shape)} does not broadcast against "
                        f"x's leading dims {tuple(lead)}") from None


def _lead(x, cos, positions) -> tuple:
    """The leading sizes (right-aligned, padded with 1), and the element strides of cos's rows
    and of positions along them (0 where broadcast), as rotary.cu takes them."""
    lead = tuple(x.shape[:-1])
    if positions is None:
        cstrides, pstrides = _lead_strides(cos[..., 0], lead, "cos"), (0,) * len(lead)
    else:
        cstrides, pstrides = (0,) * len(lead), _lead_strides(positions, lead, "positions")
    # merge a dim into the next inner one where the strides allow (both broadcast, or contiguous
    # across the two): fewer divisions per row in the kernel ([1, heads, seq] with cos [seq]
    # becomes [heads * 1 (stride 0), seq])
    dims = [[s, c, p] for s, c, p in zip(lead, cstrides, pstrides)]
    merged: list = []
    for s, c, p in dims:
        if merged and merged[-1][1] == c * s and merged[-1][2] == p * s:
            merged[-1] = [merged[-1][0] * s, c, p]
        elif s != 1 or not merged:
            merged.append([s, c, p])
    merged = [[1, 0, 0]] * (MAX_LEAD - len(merged)) + merged
    sizes, cs, ps = zip(*merged)
    return (*sizes, *cs, *ps)


_no_positions: dict = {}


ROTARY_ROWS = 1  # OPSMITH_ROTARY_ROWS in kernels/rotary.cuh
ROTARY_ROWS_HALF = 2  # OPSMITH_ROTARY_ROWS_HALF: float16's
QK_HALVES_BELOW = 8 << 20  # OPSMITH_ROTARY_ACROSS_BYTES: the tables' bytes below which q and k take a grid row each


def rows_a_trip(dtype: str, full: bool) -> int:
    """The rows a thread of rotary.cu's vector path takes a trip for ``dtype`` (its name: ``"float16"``, as the
    kernel lookup takes it) with full tables or half ones."""
    return ROTARY_ROWS_HALF if dtype == "float16" and not full else ROTARY_ROWS


@functools.lru_cache(maxsize=4096)
def _plan(rows: int, d: int, half: int, itemsize: int, props, trip: int = ROTARY_ROWS) -> "_launch.Plan":
    """Threads a row from the 16-byte vectors (pairs) it holds; rows fill a block of EW_THREADS; ``trip``: the
    kernel's rows a trip for the dtype (:func:`rows_a_trip`)."""
    n = 16 // itemsize  # elements a 16-byte vector
    vec = n if half % n == 0 and d % n == 0 else 1
    per_row = max(half // vec, (d - 2 * half) // vec, 1)
    tpr = min(_launch.EW_THREADS, 1 << (per_row - 1).bit_length())
    by = max(1, _launch.EW_THREADS // tpr)
    # the kernel's vector path with a row one chunk a thread takes `trip` rows a trip
    per_trip = trip if vec > 1 and d == 2 * half and half // vec <= tpr else 1
    return _launch.Plan("rows", (min(max(1, -(-rows // (by * per_trip))), 2**31 - 1),), (tpr, by), 0, 0)


# (shapes, strides, dtypes of the arguments) -> (half, full, memory order, _lead's tuple): the
# checks, the layout and the dim merging are pure functions of these, so a call of a shape seen
# before skips them (a bad argument raises on every call: failures are never stored)
_shape_info: dict = {}


def _memory_order(x) -> tuple | None:
    """The leading dims of ``x`` outermost first in memory, where ``x`` permuted that way is
    contiguous (a transposed ``[batch, seq, heads, d]`` view): the kernel walks its rows in
    memory order. None where ``x`` is not such a tensor: it is copied to a contiguous one."""
    lead = x.dim() - 1
    if x.is_contiguous() or x.stride(-1) != 1:
        return None
    perm = tuple(sorted(range(lead), key=lambda i: -x.stride(i)))  # stable: size-1 dims keep their place
    return perm if x.permute(*perm, lead).is_contiguous() else None


def out_like(x):
    """The output of either rotation of ``x``: ``x``'s layout where it is a permuted contiguous
    tensor with a unit last stride, else contiguous (the CUDA, CPU and fake kernels agree)."""
    import torch
    return torch.empty_like(x) if _memory_order(x) is not None else x.new_empty(x.shape)


def _checked(x, cos, sin, positions, interleaved: bool) -> tuple:
    key = (x.shape, x.stride(), x.dtype, cos.shape, cos.stride(), cos.dtype, sin.shape, sin.stride(), sin.dtype,
           None if positions is None else (positions.shape, positions.stride(), positions.dtype), interleaved)
    info = _shape_info.get(key)
    if info is None:
        half, full = check(x, cos, sin, positions, interleaved)
        order = _memory_order(x)
        pos = None if positions is None else positions.contiguous()
        lead_shape = tuple(x.shape[:-1])
        xv, cv, pv = x, cos.contiguous(), pos
        if order is not None:  # the rows in memory order; the strides of cos's rows (or positions) follow them
            xv = x.permute(*order, len(lead_shape))
            if pos is None:
                cv = cv.expand(*lead_shape, cv.shape[-1]).permute(*order, len(lead_shape))
            else:  # cos is a [max_position, half] table, indexed by the positions alone
                pv = pos.expand(*lead_shape).permute(*order)
        info = (half, full, order, _lead(xv, cv, pv))
        if len(_shape_info) > 4096:  # a bound for processes that see endless shapes
            _shape_info.clear()
        _shape_info[key] = info
    return info


def _prepared(x, cos, sin, positions, interleaved: bool):
    """``(y, x and y in memory order, rows, half, full, lead)`` for the kernel: ``y`` allocated
    (``x``'s layout where ``x`` is a permuted contiguous tensor, else ``x`` is copied first)."""
    import torch
    half, full, order, lead = _checked(x, cos, sin, positions, interleaved)
    if order is None:
        x = x.contiguous()
    y = torch.empty_like(x)  # a permuted contiguous x: y takes its layout; both reach the kernel in memory order
    xk, yk = (x, y) if order is None else (x.permute(*order, x.dim() - 1), y.permute(*order, x.dim() - 1))
    d = x.shape[-1]
    return y, xk, yk, (x.numel() // d if d else 0), half, full, lead


def _tables(x, cos, sin, positions):
    """cos, sin and the positions as the kernel reads them (a one-element placeholder without)."""
    import torch
    cos, sin = cos.contiguous(), sin.contiguous()
    if positions is not None:
        return cos, sin, positions.to(device=x.device, dtype=torch.long).contiguous()
    pos = _no_positions.get(x.device)
    if pos is None:
        pos = _no_positions.setdefault(x.device, torch.zeros(1, dtype=torch.long, device=x.device))
    return cos, sin, pos


def plan_one(x, rows: int, half: int, full: bool, dt: str) -> "_launch.Plan":
    """The launch of rotary.cu's (rotary_ip.cu's) kernel over the ``rows`` of ``x``."""
    return _plan(rows, x.shape[-1], half, x.element_size(), _launch.device_props(x.get_device()),
                 rows_a_trip(dt, full))


def plan_qk(q, rows_q: int, rows_k: int, half: int, full: bool, dt: str, lead: tuple) -> "_launch.Plan":
    """The launch of the q-and-k kernels over the grid of the longer tensor, once for each: where the tables of q's
    positions (``lead``'s innermost size, :func:`_lead`) hold less than :data:`QK_HALVES_BELOW` bytes, two rows of
    blocks (q's, then k's), else one row, q's and k's alternating (see OPSMITH_ROTARY_QK_BODY in rotary.cuh)."""
    plan = plan_one(q, max(rows_q, rows_k), half, full, dt)
    tables = lead[MAX_LEAD - 1] * (2 * half if full else half) * 2 * q.element_size()
    if tables < QK_HALVES_BELOW:
        return plan._replace(grid=(plan.grid[0], 2))
    return plan._replace(grid=(2 * min(plan.grid[0], 2**30 - 1),))


# the dtypes whose rotations of the common case take rotary.cu's rotary_lean (bench/diag_rotary.py's l1 sets float32's,
# l0 none). Made for float32, which rotary_qk leaves 1-3 % behind torch.compile on [1, heads, seq, 128] (the 2-byte
# types lead compile through rotary_qk). H100, 2026-12-06, ninth session, one run: its 195 rotary GPU tests passed and
# float32 forward + backward read 0.996-1.106x compile against rotary_qk's 0.969-1.056x (docs/ops.md, "rotary's lean
# kernel")
LEAN_DTYPES: tuple = ("float32",)
LEAN_ROWS = 2**31  # rotary_lean's rows a tensor: below this (its row index is 32-bit)
# rotary_lean's cos + sin bytes: at most this. Its blocks walk every head's rows in turn, so each head reads the whole
# table again, and a table past L2's share comes from memory each time: H100, float32 [1, heads, seq, 128], one run
# (docs/ops.md, "rotary's lean kernel"), 8 MiB (seq 16384) 1.09-1.11x compile, 16 and 32 MiB 0.84-0.86x against
# rotary_qk's 1.14-1.19x (which rotates a position's heads together)
LEAN_TABLE_BYTES = 8 * 2**20


def lean(dt: str, half: int, full: bool, interleaved: bool, has_pos: bool, cos, sin, pairs: list) -> bool:
    """Whether rotary_lean takes the rotation of each ``(x, y, rows, lead)`` in ``pairs`` (x and y in memory order):
    ``dt`` in :data:`LEAN_DTYPES`, neox half tables without positions, rows of exactly ``2 * half`` elements of whole
    16-byte vectors (at most a block's threads of them), one table row a position (``lead``'s innermost dim alone
    strides cos, by ``half``, the same for every tensor), contiguous and 16-byte aligned (cos and sin too), below
    :data:`LEAN_ROWS` rows, tables of at most :data:`LEAN_TABLE_BYTES`."""
    if dt not in LEAN_DTYPES or full or interleaved or has_pos or cos.data_ptr() % 16 or sin.data_ptr() % 16:
        return False
    x0, _, _, lead0 = pairs[0]
    n = 16 // x0.element_size()
    if x0.shape[-1] != 2 * half or half % n or half // n > _launch.EW_THREADS \
            or 2 * lead0[MAX_LEAD - 1] * half * x0.element_size() > LEAN_TABLE_BYTES:
        return False
    return all(lead[MAX_LEAD - 1] == lead0[MAX_LEAD - 1] and lead[MAX_LEAD:2 * MAX_LEAD] == (0, 0, 0, half)
               and rows < LEAN_ROWS and x.is_contiguous() and y.is_contiguous()
               and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0 for x, y, rows, lead in pairs)


def _launch_lean(xs: tuple, ys: tuple, rows: tuple, cos, sin, half: int, lead: tuple, sign: int, dt: str) -> None:
    """rotary_lean over one tensor or two (q's blocks, then k's: the grid's two rows)."""
    x = xs[0]  # a row a thread, one trip: the plan's blocks at 1 row a trip cover every row
    plan = _plan(max(rows), x.shape[-1], half, x.element_size(), _launch.device_props(x.get_device()), 1)
    kern = _sources.kernel("rotary.cu", "rotary_lean<{T}>", dt, x.get_device())
    two = len(xs) == 2
    kern.launch(_launch.launch_config(plan._replace(grid=(plan.grid[0], 2 if two else 1))), xs[0], xs[-1], cos, sin,
                ys[0], ys[-1], rows[0], rows[-1] if two else 0, half, lead[MAX_LEAD - 1], sign)


def rotary_cuda(x, cos, sin, positions=None, interleaved: bool = False, sign: int = 1):
    """The rotation (``sign=-1``: the inverse) on CUDA."""
    y, xk, yk, rows, half, full, lead = _prepared(x, cos, sin, positions, interleaved)
    if not rows:
        return y
    d = x.shape[-1]
    cos, sin, pos = _tables(x, cos, sin, positions)
    dt = fn._dtype_name(x, "rotary_embedding")
    if lean(dt, half, full, interleaved, positions is not None, cos, sin, [(xk, yk, rows, lead)]):
        _launch_lean((xk,), (yk,), (rows,), cos, sin, half, lead, sign, dt)
        return y
    plan = plan_one(x, rows, half, full, dt)
    k = _sources.kernel("rotary.cu", "rotary_full<{T}>" if full else "rotary<{T}>", dt, x.get_device())
    k.launch(_launch.launch_config(plan), xk, cos, sin, pos, yk, rows, d, half, int(interleaved), sign,
             int(positions is not None), *lead)
    return y


def check_qk(q, k) -> None:
    """q and k rotate together where they share dtype, device and head dim (a SpecError otherwise)."""
    if q.dtype != k.dtype or q.device != k.device or q.dim() < 1 or k.dim() < 1 or q.shape[-1] != k.shape[-1]:
        raise SpecError(f"opsmith.ops.rotary_embedding_qk: q and k must share dtype, device and head dim, got "
                        f"{q.dtype} {tuple(q.shape)} on {q.device} and {k.dtype} {tuple(k.shape)} on {k.device}; "
                        f"rotate each with rotary_embedding")


def rotary_qk_cuda(q, k, cos, sin, positions=None, interleaved: bool = False, sign: int = 1):
    """Both rotations in one launch (``rotary_qk``, :func:`plan_qk`'s grid); a tensor
    without rows leaves the other to :func:`rotary_cuda`."""
    check_qk(q, k)
    yq, qk_, yqk, rows_q, half, full, lead_q = _prepared(q, cos, sin, positions, interleaved)
    yk, kk, ykk, rows_k, _, _, lead_k = _prepared(k, cos, sin, positions, interleaved)
    if not rows_q or not rows_k:
        return (rotary_cuda(q, cos, sin, positions, interleaved, sign) if rows_q else yq,
                rotary_cuda(k, cos, sin, positions, interleaved, sign) if rows_k else yk)
    d = q.shape[-1]
    cos, sin, pos = _tables(q, cos, sin, positions)
    dt = fn._dtype_name(q, "rotary_embedding_qk")
    if lean(dt, half, full, interleaved, positions is not None, cos, sin,
            [(qk_, yqk, rows_q, lead_q), (kk, ykk, rows_k, lead_k)]):
        _launch_lean((qk_, kk), (yqk, ykk), (rows_q, rows_k), cos, sin, half, lead_q, sign, dt)
        return yq, yk
    plan = plan_qk(q, rows_q, rows_k, half, full, dt, lead_q)
    kern = _sources.kernel("rotary.cu", "rotary_qk_full<{T}>" if full else "rotary_qk<{T}>", dt, q.get_device())
    kern.launch(_launch.launch_config(plan), qk_, kk, cos, sin, pos, yqk, ykk, rows_q, rows_k, d, half,
                int(interleaved), sign, int(positions is not None), *lead_q, *lead_k)
    return yq, yk


def _cpu(x, cos, sin, positions=None, interleaved: bool = False, sign: int = 1):
    """The rotation in torch (float32 math for 16-bit inputs, as the kernel)."""
    import torch
    half, full = check(x, cos, sin, positions, interleaved)
    c, s = (cos[positions.long()], sin[positions.long()]) if positions is not None else (cos, sin)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, c, s = x.to(acc), c.to(acc), s.to(acc)
    c1, s1, c2, s2 = (c[..., :half], s[..., :half], c[..., half:], s[..., half:]) if full else (c, s, c, s)
    sa, sb = (s1, s2) if sign > 0 else (-s2, -s1)  # the inverse: the transpose of the rotation
    a, b = (xf[..., 0:2 * half:2], xf[..., 1:2 * half:2]) if interleaved else (xf[..., :half], xf[..., half:2 * half])
    ra, rb = a * c1 - b * sa, b * c2 + a * sb
    rot = torch.stack([ra, rb], dim=-1).flatten(-2) if interleaved else torch.cat([ra, rb], dim=-1)
    out = out_like(x)
    return out.copy_(torch.cat([rot, xf[..., 2 * half:]], dim=-1))


def _cpu_qk(q, k, cos, sin, positions=None, interleaved: bool = False, sign: int = 1):
    check_qk(q, k)
    return _cpu(q, cos, sin, positions, interleaved, sign), _cpu(k, cos, sin, positions, interleaved, sign)


def _fake_qk(q, k, *args, **kwargs):
    check_qk(q, k)
    return out_like(q), out_like(k)


def _no_table_grads(ctx, first_table: int) -> None:
    """A SpecError where cos or sin want a gradient (``first_table``: cos's needs_input_grad index;
    [0] is the key set, the op's inputs follow)."""
    if ctx.needs_input_grad[first_table] or ctx.needs_input_grad[first_table + 1]:
        raise SpecError("opsmith.ops.rotary_embedding: gradients for cos and sin are not computed; pass "
                        "them detached (cos.detach()) or use torch's own rotation where you train them")


def define_all(define) -> list:
    """Define the operators through ``define(name, schema, cuda, cpu, fake)`` with the forwards'
    autograd; returns the ops whose CUDA implementation is registered on every machine."""
    args = "Tensor cos, Tensor sin, Tensor? positions=None, bool interleaved=False"
    op = define("rotary_embedding", f"(Tensor x, {args}) -> Tensor",
                lambda x, c, s, p=None, i=False: rotary_cuda(x, c, s, p, i, 1),
                lambda x, c, s, p=None, i=False: _cpu(x, c, s, p, i, 1), lambda x, *a, **k: out_like(x))
    back = define("rotary_embedding_backward", f"(Tensor grad, {args}) -> Tensor",
                  lambda g, c, s, p=None, i=False: rotary_cuda(g, c, s, p, i, -1),
                  lambda g, c, s, p=None, i=False: _cpu(g, c, s, p, i, -1), lambda g, *a, **k: out_like(g))
    qk = define("rotary_embedding_qk", f"(Tensor q, Tensor k, {args}) -> (Tensor, Tensor)",
                lambda q, k, c, s, p=None, i=False: rotary_qk_cuda(q, k, c, s, p, i, 1),
                lambda q, k, c, s, p=None, i=False: _cpu_qk(q, k, c, s, p, i, 1), _fake_qk)
    qk_back = define("rotary_embedding_qk_backward", f"(Tensor grad_q, Tensor grad_k, {args}) -> (Tensor, Tensor)",
                     lambda gq, gk, c, s, p=None, i=False: rotary_qk_cuda(gq, gk, c, s, p, i, -1),
                     lambda gq, gk, c, s, p=None, i=False: _cpu_qk(gq, gk, c, s, p, i, -1), _fake_qk)

    def setup_context(ctx, inputs, output):
        *_, cos, sin, positions, interleaved = inputs
        ctx.save_for_backward(cos, sin, positions)
        ctx.interleaved = interleaved

    def backward(ctx, grad):
        _no_table_grads(ctx, 2)
        cos, sin, positions = ctx.saved_tensors
        return back.default(grad, cos, sin, positions, ctx.interleaved), None, None, None, None

    def backward_qk(ctx, grad_q, grad_k):
        _no_table_grads(ctx, 3)
        cos, sin, positions = ctx.saved_tensors
        if grad_q is None or grad_k is None:  # one output unused: the other's inverse alone
            one = [None if g is None else back.default(g, cos, sin, positions, ctx.interleaved)
                   for g in (grad_q, grad_k)]
            return *one, None, None, None, None
        return *qk_back.default(grad_q, grad_k, cos, sin, positions, ctx.interleaved), None, None, None, None

    op.register_autograd(backward, setup_context)
    qk.register_autograd(backward_qk, setup_context)
    return [op, back, qk, qk_back]
