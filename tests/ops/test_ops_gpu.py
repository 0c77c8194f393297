"""opsmith.ops on a GPU: every op against torch in float64, forward and backward, in every dtype,
on a seeded sweep of shapes (row length 1, odd, non-powers of two, longer than registers and
than shared memory, empty tensors, non-contiguous and misaligned inputs), inf/NaN as torch,
gradcheck in float64.

Tolerances (rtol, atol) against torch in float64 on the same (already rounded) inputs; the
error is the output's rounding to its dtype plus float32 arithmetic (docs/ops.md says the same):
    float32 (1e-4, 1e-5), float16 (2e-3, 1e-4), bfloat16 (1.6e-2, 1e-3), float64 (1e-10, 1e-12);
weight and bias gradients (sums over rows) take atol * sqrt(rows).
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from opsmith import ops
from opsmith.ops import _launch, _launch_bwd, _launch_norm

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 1e-4), torch.bfloat16: (1.6e-2, 1e-3),
       torch.float64: (1e-10, 1e-12)}
DT_IDS = [str(d).replace("torch.", "") for d in DTYPES]

EW_SIZES = [0, 1, 7, 1000, 4099, (1 << 20) + 3, (33, 65)]
EW_OPS = {
    "relu": (ops.relu, torch.relu),
    "gelu": (ops.gelu, F.gelu),
    "gelu_tanh": (lambda x: ops.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (ops.silu, F.silu),
}
# (rows, cols): 1, odd, non-powers of two, warp / block / long rows, long rows that do not fit
# in shared memory (fp32 backward: 2 x 70001 x 4 bytes), empty
ROW_SHAPES = [(1, 1), (3, 1), (5, 7), (64, 64), (33, 100), (7, 255), (16, 1000), (4, 1024), (3, 3001),
              (2, 4096), (2, 4097), (3, 8193), (2, 20000), (1, 32768), (2, 70001), (0, 64), (300, 33),
              (4099, 256), (2500, 3000),  # the persistent norm backwards: many trips a block
              (1100, 2048),  # the "split" norm backwards, their weight gradients in several chunks
              (1024, 512), (200, 4096), (1000, 33),  # "small" (one launch) at its edges: rows, row width, lanes
              (700, 12000), (300, 16385),  # sm_90+: the cluster kernels' many trips (K = 2 and 8)
              (64, 32768), (24, 65536),  # backward clusters of 8 blocks of 512 threads (float, 16-bit), many trips
              (2, 131072),  # the norms' l2 forwards at 1,024 threads of many chunks
              (1, 1000), (1, 8192),  # one row: the split backwards write the weight gradients themselves
              (5, 8192), (4, 16384),  # rows of 32 KiB in one pass (norm_c8_plan): float, 16-bit
              (600, 6144), (300, 8192)]  # float backwards at 4 chunks (norm_bwd_c4_plan): chunks past the row, many trips


def _close(actual, expected, dtype, scale=1.0, what=""):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol * scale,
                               equal_nan=True, msg=lambda m: f"{what}: {m}")


def _rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, device="cuda", dtype=torch.float32, generator=g).to(dtype)


def _grads(fn, inputs, grad_out):
    """Gradients of fn(*inputs) . grad_out for the inputs that require them."""
    out = fn(*inputs)
    return torch.autograd.grad(out, [t for t in inputs if t is not None and t.requires_grad], grad_out)


def _leaf(t, requires_grad=True):
    return None if t is None else t.detach().clone().requires_grad_(requires_grad)


# -- elementwise --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("size", EW_SIZES, ids=str)
@pytest.mark.parametrize("op", list(EW_OPS))
def test_elementwise_matches_float64_torch(op, size, dtype):
    ours, ref = EW_OPS[op]
    x = _rand(size, dtype, 1) * 3
    g = _rand(size, dtype, 2)
    xo, xr = _leaf(x), _leaf(x.double())
    y = ours(xo)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, ref(xr), dtype, what=f"{op} forward")
    (dx,) = torch.autograd.grad(y, xo, g) if x.numel() else (torch.zeros_like(x),)
    (dxr,) = torch.autograd.grad(ref(xr), xr, g.double()) if x.numel() else (torch.zeros_like(xr),)
    _close(dx, dxr, dtype, what=f"{op} backward")


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DT_IDS[:3])
@pytest.mark.parametrize("op", list(EW_OPS))
def test_elementwise_noncontiguous_and_misaligned(op, dtype):
    ours, ref = EW_OPS[op]
    base = _rand((257, 129), dtype, 3) * 3
    for x in (base.t(), base[:, 1:], base.reshape(-1)[1:]):  # transposed, strided, 16-byte misaligned
        _close(ours(x), ref(x.double()), dtype, what=f"{op} on a view {tuple(x.stride())}")


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DT_IDS[:3])
def test_elementwise_unrolled_and_one_vector_plans(dtype):
    """The erf GELU's forward takes the unrolled trips from half a wave of blocks, one vector a thread below,
    as every other op: both paths, with a tail, against float64 (and its backward, one vector a thread)."""
    from opsmith.ops import _launch
    props = _launch.device_props(torch.cuda.current_device())
    x_size = torch.tensor([], dtype=dtype).element_size()
    vec = 16 // x_size
    blocks = props.sm_count * (props.max_threads_per_sm // _launch.EW_THREADS)
    wave = blocks * _launch.EW_THREADS * vec * _launch.EW_UNROLL  # elements
    for n, unrolled in ((wave // 2 + 5, True), (wave // 4 + 3, False)):
        assert (_launch.elementwise_plan(n, x_size, props, True).grid[0] * _launch.EW_THREADS * vec < n) == unrolled
        x = _rand(n, dtype, 4) * 3
        _close(ops.gelu(x), F.gelu(x.double()), dtype, what=f"gelu forward, n={n}")
        xo, xr = _leaf(x), _leaf(x.double())
        g = _rand(n, dtype, 5)
        (dx,) = torch.autograd.grad(ops.gelu(xo), xo, g)
        (dxr,) = torch.autograd.grad(F.gelu(xr), xr, g.double())
        _close(dx, dxr, dtype, what=f"gelu backward, n={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("op", list(EW_OPS))
def test_elementwise_inf_nan_as_torch(op, dtype):
    ours, ref = EW_OPS[op]
    vals = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1.0, -1.0, 30.0, -30.0]
    x = torch.tensor(vals * 5, device="cuda", dtype=dtype)
    torch.testing.assert_close(ours(x), ref(x), equal_nan=True, rtol=TOL[dtype][0], atol=TOL[dtype][1])
    xo = _leaf(x)
    (dx,) = torch.autograd.grad(ours(xo), xo, torch.ones_like(x))
    assert torch.isnan(dx[2::9]).all() or op == "relu"  # a NaN input gives a NaN gradient (relu: 0, as torch)


# -- softmax ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
def test_softmax_matches_float64_torch(shape, dtype):
    x = _rand(shape, dtype, 4) * 4
    g = _rand(shape, dtype, 5)
    xo = _leaf(x)
    y = ops.softmax(xo, -1)
    _close(y, torch.softmax(x.double(), -1), dtype, what="softmax forward")
    if not x.numel():
        return
    (dx,) = torch.autograd.grad(y, xo, g)
    # the backward reads the saved output (rounded to dtype), as torch's does: the reference too
    yr = y.detach().double()
    expected = yr * (g.double() - (g.double() * yr).sum(-1, keepdim=True))
    _close(dx, expected, dtype, what="softmax backward")


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DT_IDS[:3])
def test_softmax_any_dim_and_views(dtype):
    x = _rand((6, 33, 70), dtype, 6)
    for dim in (0, 1, 2, -1, -3):
        _close(ops.softmax(x, dim), torch.softmax(x.double(), dim), dtype, what=f"softmax dim={dim}")
    for v in (x.transpose(1, 2), x[:, :, 1:], x.reshape(-1)[1:-6].reshape(-1, 7)):
        _close(ops.softmax(v, -1), torch.softmax(v.double(), -1), dtype, what=f"softmax view {tuple(v.stride())}")
    s = torch.tensor(2.5, device="cuda", dtype=dtype)
    assert ops.softmax(s, 0).item() == 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_softmax_rows_that_fill_wide3_aligned_or_not(dtype):
    """softmax_fwd_wide3_full takes the rows of exactly 512 threads' chunks (bf16 16,384, float 8,192) when
    x is 16-byte aligned; a view one element in takes softmax_fwd_wide3's element path."""
    cols = 512 * 4 * 16 // torch.empty((), dtype=dtype).element_size()
    flat = _rand((3 * cols + 1,), dtype, 9) * 4
    for x in (flat[:-1].view(3, cols), flat[1:].view(3, cols)):  # contiguous: aligned, then one element in
        _close(ops.softmax(x, -1), torch.softmax(x.double(), -1), dtype, what=f"softmax {tuple(x.stride())}")


@pytest.mark.parametrize("cols", [16385, 24000, 32768])
def test_softmax_float_rows_of_8_chunks_aligned_or_not(cols):
    """Float rows of 16,385-32,768 take softmax_fwd_wide<float, 8> (and the backward's rows that fill its chunks,
    32,768, softmax_bwd_wide_sm<float, 8>, grad_y staged in shared memory): forward and backward against float64,
    x and grad 16-byte aligned and views one element in (the element paths)."""
    flat = _rand((3 * cols + 1,), torch.float32, 10) * 4
    gflat = _rand((3 * cols + 1,), torch.float32, 11)
    for x in (flat[:-1].view(3, cols), flat[1:].view(3, cols)):
        for g in (gflat[:-1].view(3, cols), gflat[1:].view(3, cols)):
            xo = _leaf(x)
            y = ops.softmax(xo, -1)
            _close(y, torch.softmax(x.double(), -1), torch.float32, what=f"softmax {cols} {x.data_ptr() % 16}")
            (dx,) = torch.autograd.grad(y, xo, g)
            yr = y.detach().double()
            _close(dx, yr * (g.double() - (g.double() * yr).sum(-1, keepdim=True)), torch.float32,
                   what=f"backward {cols}, grad {g.data_ptr() % 16}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", [(1, 64), (37, 128), (5, 1024), (3, 2048), (2, 4096)])
def test_softmax_register_rows_that_fill_their_chunks_aligned_or_not(dtype, shape):
    """softmax_fwd_full takes the register rows that fill their threads' chunks (warp rows, and a block's for
    float and double at 1,024), softmax_fwd_wide_full 16-bit rows of 2 to 8 KiB at 4 chunks a thread, when x is
    16-byte aligned; a view one element in takes softmax_fwd's (softmax_fwd_wide's) element path."""
    rows, cols = shape
    flat = _rand((rows * cols + 1,), dtype, 10) * 4
    for x in (flat[:-1].view(rows, cols), flat[1:].view(rows, cols)):
        _close(ops.softmax(x, -1), torch.softmax(x.double(), -1), dtype, what=f"softmax {shape} {tuple(x.stride())}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("cols", [3072, 5120, 6144, 12288, 20480, 24576])
def test_softmax_rows_of_whole_warps_at_their_threads_aligned_or_not(dtype, cols):
    """Rows that are whole warps of their chunks a thread, fewer than the power of two (_launch._whole_warps; the 16-bit
    backwards "wide" at 4 chunks, 20,480 and 24,576 instead of clusters): forward and backward against float64, x
    16-byte aligned (the unchecked kernels, softmax_fwd_wide3_full at 384 threads) and a view one element in."""
    rows = 3
    flat = _rand((rows * cols + 1,), dtype, 14) * 4
    g = _rand((rows, cols), dtype, 15)
    for x in (flat[:-1].view(rows, cols), flat[1:].view(rows, cols)):
        xo = _leaf(x)
        y = ops.softmax(xo, -1)
        _close(y, torch.softmax(x.double(), -1), dtype, what=f"softmax {cols} {x.data_ptr() % 16}")
        (dx,) = torch.autograd.grad(y, xo, g)
        yr = y.detach().double()
        _close(dx, yr * (g.double() - (g.double() * yr).sum(-1, keepdim=True)), dtype, what=f"backward {cols}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", [(5, 1024), (3, 2048), (2, 4096), (4, 3000)])
def test_norm_rows_of_four_chunks_that_fill_them_aligned_or_not(dtype, shape):
    """layer_norm_fwd_c4_full / rms_norm_fwd_c4_full take norm_c4_plan's rows that fill their threads' chunks when
    every pointer is 16-byte aligned (16-bit layer_norm rows of 1,024 and 2,048: layer_norm_fwd_full, 2 chunks); a
    view one element in (and 3,000 columns) take the checked c4 kernels."""
    rows, cols = shape
    flat = _rand((rows * cols + 1,), dtype, 11) * 3 + 1
    w, b = _rand((cols,), dtype, 12), _rand((cols,), dtype, 13)
    for x in (flat[:-1].view(rows, cols), flat[1:].view(rows, cols)):
        x64 = x.double()
        _close(ops.layer_norm(x, [cols], w, b), F.layer_norm(x64, [cols], w.double(), b.double()), dtype,
               what=f"layer_norm {shape} {x.data_ptr() % 16}")
        _close(ops.rms_norm(x, [cols], w, 1e-6), F.rms_norm(x64, [cols], w.double(), 1e-6), dtype,
               what=f"rms_norm {shape} {x.data_ptr() % 16}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", [(1100, 1536), (1030, 2560), (1300, 3072), (9, 5120), (1100, 5120), (5, 7168),
                                   (1030, 7680), (5, 10240), (3, 12288)], ids=str)
def test_norm_rows_of_whole_warps_at_their_threads_aligned_or_not(dtype, shape):
    """Rows that are whole warps of their chunks a thread, fewer than the power of two: the forwards of 4 chunks
    (norm_c4_plan: bf16 5,120 at 160 threads, float layer_norm 1,536-3,072), of 2 (norm_fwd_plan: float rms_norm,
    add_rms_norm), of 8 (norm_c8_plan, add_rms_c8_plan: bf16 10,240 and 12,288, float 5,120 and 7,168) and the
    persistent and split backwards of 2 (norm_bwd_plan: 96 threads in blocks of two rows, 160 to 480), layer_norm,
    rms_norm, add_layer_norm (which shares norm_c4_plan) and add_rms_norm against float64, forward and backward with
    the weight and bias gradients, x 16-byte aligned (the unchecked kernels) and a view one element in; more than
    SMALL_BWD_ROWS rows, or rows too long for norm_bwd_small_plan, so that the backwards take norm_bwd_plan."""
    rows, cols = shape
    props = _launch.device_props(torch.cuda.current_device())
    size = torch.tensor([], dtype=dtype).element_size()
    if size != 8:  # what this test is about: the plans at exactly the threads of whole warps
        bwd = _launch_bwd.norm_bwd_plan(rows, cols, size, props)
        assert bwd.strategy == "long" or bwd.block[0] * _launch.ROW_CHUNKS * (16 // size) == cols, bwd
    flat = _rand((rows * cols + 1,), dtype, 21) * 3 + 1
    res = _rand((rows, cols), dtype, 22)
    w, b, g = _rand((cols,), dtype, 23), _rand((cols,), dtype, 24), _rand((rows, cols), dtype, 25)
    scale = math.sqrt(rows)
    for x in (flat[:-1].view(rows, cols), flat[1:].view(rows, cols)):
        at = f"{shape} {x.data_ptr() % 16}"
        for name, ours, ref, args in (
                ("layer_norm", lambda x, w, b: ops.layer_norm(x, [cols], w, b),
                 lambda x, w, b: F.layer_norm(x, [cols], w, b), (x, w, b)),
                ("rms_norm", lambda x, w: ops.rms_norm(x, [cols], w, 1e-6),
                 lambda x, w: F.rms_norm(x, [cols], w, 1e-6), (x, w))):
            mine, theirs = [_leaf(t) for t in args], [_leaf(t.double()) for t in args]
            _close(ours(*mine), ref(*theirs), dtype, what=f"{name} {at}")
            got, want = _grads(ours, mine, g), _grads(ref, theirs, g.double())
            _close(got[0], want[0], dtype, what=f"{name} grad_x {at}")
            for i, (a, e) in enumerate(zip(got[1:], want[1:])):
                _close(a, e, dtype, scale=scale, what=f"{name} grad of parameter {i} {at}")
        y, r = ops.add_layer_norm(x, res, [cols], w, b)
        _close(r, x.double() + res.double(), dtype, what=f"add_layer_norm residual {at}")
        _close(y, F.layer_norm(r.double(), [cols], w.double(), b.double()), dtype, what=f"add_layer_norm {at}")
        mine = [_leaf(t) for t in (x, res, w)]
        y, r = ops.add_rms_norm(*mine[:2], [cols], mine[2], 1e-6)
        _close(r, x.double() + res.double(), dtype, what=f"add_rms_norm residual {at}")
        _close(y, F.rms_norm(r.double(), [cols], w.double(), 1e-6), dtype, what=f"add_rms_norm {at}")
        s64, w64 = _leaf(r.detach().double()), _leaf(w.double())  # the residual as ours rounds it
        gs, gw = torch.autograd.grad(F.rms_norm(s64, [cols], w64, 1e-6), (s64, w64), g.double())
        want = (gs + g.double(), gs + g.double(), gw)  # x and residual: through y and residual_out
        got = torch.autograd.grad((y, r), mine, (g, g))
        for i, (a, e) in enumerate(zip(got, want)):
            _close(a, e, dtype, scale=scale if i == 2 else 1.0, what=f"add_rms_norm grad {i} {at}")


@pytest.mark.parametrize("cols", [12288, 9001, 2048, 16384])
def test_softmax_of_values_near_the_bf16_limit(cols):
    """softmax_fwd_wide3 takes exp2(x log2e - m log2e) for 16-bit rows only where m log2e is finite: a
    row whose max is near bf16's largest value (3.39e38) takes (x - m) log2e, and matches torch."""
    x = _rand((4, cols), torch.bfloat16, 8)
    x[0, 5], x[0, 9] = 3.3e38, 3.2e38
    x[1] = -3.3e38
    x[1, 3] = -3.2e38
    x[2, -1] = 1.5e38
    got = ops.softmax(x, -1).double()
    torch.testing.assert_close(got, torch.softmax(x.double(), -1), rtol=TOL[torch.bfloat16][0],
                               atol=TOL[torch.bfloat16][1])
    assert got[0, 5] > 0.99 and torch.isfinite(got).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
# warp, block, wide (fp32) / long, wide (bf16) / long (cached), long (not cached); wide3 (bf16 12288)
@pytest.mark.parametrize("cols", [7, 1000, 16384, 20000, 70001, 12288])
def test_softmax_inf_nan_as_torch(cols, dtype):
    x = _rand((6, cols), dtype, 7)
    x[0, cols // 2] = float("nan")
    x[1, cols // 3] = float("inf")
    x[2] = float("-inf")
    x[3, : cols // 2] = float("-inf")  # some -inf, the rest finite: those get probability 0
    x[4, 0] = float("inf")
    x[4, -1] = float("inf")
    x[5, -1] = float("-inf")
    torch.testing.assert_close(ops.softmax(x, -1).double(), torch.softmax(x.double(), -1), equal_nan=True,
                               rtol=TOL[dtype][0], atol=TOL[dtype][1])


# -- layer_norm and rms_norm ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_layer_norm_matches_float64_torch(shape, dtype, affine):
    rows, cols = shape
    x = _rand(shape, dtype, 8) * 2 + 0.5
    g = _rand(shape, dtype, 9)
    w = _rand(cols, dtype, 10) if affine != "none" else None
    b = _rand(cols, dtype, 11) if affine == "wb" else None
    args = [_leaf(x), _leaf(w), _leaf(b)]
    refs = [_leaf(t.double()) if t is not None else None for t in (x, w, b)]
    y = ops.layer_norm(args[0], (cols,), args[1], args[2], 1e-5)
    yr = F.layer_norm(refs[0], (cols,), refs[1], refs[2], 1e-5)
    _close(y, yr, dtype, what="layer_norm forward")
    if not x.numel():
        return
    got = torch.autograd.grad(y, [t for t in args if t is not None], g)
    want = torch.autograd.grad(yr, [t for t in refs if t is not None], g.double())
    _close(got[0], want[0], dtype, what="layer_norm grad x")
    for name, a, e in zip(("grad w", "grad b"), got[1:], want[1:]):
        _close(a, e, dtype, scale=math.sqrt(rows), what=f"layer_norm {name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("cols", [1000, 4096, 8192, 16384, 32768])  # from 16384: the l2 forward's merged chunks
@pytest.mark.parametrize("rows", ["large mean", "outlier first", "constant", "inf", "nan"])
def test_layer_norm_16bit_shifted_variance_holds_on_hard_rows(rows, cols, dtype):
    """16-bit register rows on the rows that break one-reduction variances: a large mean (E[x^2] -
    E[x]^2), the first element far out (the shifted form E[d^2] - E[d]^2, d = x - x[0], which
    missed fp16's tolerance here and was not kept), constant rows; an inf or NaN makes the row NaN,
    as torch."""
    x = _rand((6, cols), torch.float32, 30)
    if rows == "large mean":
        x = x + 300.0
    elif rows == "outlier first":
        x[:, 0] = 250.0
    elif rows == "constant":
        x = torch.full_like(x, 3.0)
    elif rows == "inf":
        x[:, cols // 2] = float("inf")
        x[3, 0] = float("-inf")
    else:
        x[:, 7] = float("nan")
    x = x.to(dtype)
    w, b = _rand(cols, dtype, 31), _rand(cols, dtype, 32)
    y = ops.layer_norm(x, (cols,), w, b, 1e-5)
    yr = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
    if rows in ("inf", "nan"):
        assert torch.isnan(y).all()
    else:
        _close(y, yr, dtype, what=f"layer_norm forward, {rows}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["w", "none"])
def test_rms_norm_matches_float64_torch(shape, dtype, affine):
    rows, cols = shape
    x = _rand(shape, dtype, 12) * 2 + 0.5
    g = _rand(shape, dtype, 13)
    w = _rand(cols, dtype, 14) if affine else None
    eps = torch.finfo(dtype).eps
    args = [_leaf(x), _leaf(w)]
    refs = [_leaf(x.double()), _leaf(w.double()) if w is not None else None]
    y = ops.rms_norm(args[0], (cols,), args[1])  # eps=None: the dtype's eps, as torch
    yr = F.rms_norm(refs[0], (cols,), refs[1], eps)
    _close(y, yr, dtype, what="rms_norm forward")
    if not x.numel():
        return
    got = torch.autograd.grad(y, [t for t in args if t is not None], g)
    want = torch.autograd.grad(yr, [t for t in refs if t is not None], g.double())
    _close(got[0], want[0], dtype, what="rms_norm grad x")
    if affine:
        _close(got[1], want[1], dtype, scale=math.sqrt(rows), what="rms_norm grad w")


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DT_IDS[:3])
def test_norms_multi_dim_shapes_and_views(dtype):
    x = _rand((4, 6, 10, 12), dtype, 15)
    w, b = _rand((10, 12), dtype, 16), _rand((10, 12), dtype, 17)
    _close(ops.layer_norm(x, (10, 12), w, b), F.layer_norm(x.double(), (10, 12), w.double(), b.double()), dtype,
           what="layer_norm over two dims")
    v = x.transpose(0, 1)
    _close(ops.rms_norm(v, 12, w[0]), F.rms_norm(v.double(), (12,), w[0].double(), torch.finfo(dtype).eps), dtype,
           what="rms_norm of a transposed view")
    m = ops.LayerNorm(12, device="cuda", dtype=dtype)
    _close(m(x), F.layer_norm(x.double(), (12,)), dtype, what="LayerNorm module")
    r = ops.RMSNorm(12, eps=1e-6, device="cuda", dtype=dtype)
    _close(r(x), F.rms_norm(x.double(), (12,), eps=1e-6), dtype, what="RMSNorm module")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape", [(2, 64), (64, 1024), (100, 100), (257, 512)], ids=str)
def test_norm_backwards_of_few_rows_in_one_launch(shape, dtype):
    """norm_small.cu ("small": grad_x blocks and weight blocks in one launch) on aligned and misaligned rows
    (its element paths), with the weight's gradient wanted and the bias's not, and the other way round, and on
    the native C++ path and the Python one alike, against float64."""
    from opsmith.ops import _launch_norm, _norms
    rows, cols = shape
    assert _launch_bwd.norm_bwd_small_plan(rows, cols, torch.tensor([], dtype=dtype).element_size(),
                                           _launch.device_props(0)) is not None
    base, g = _rand((rows * cols + 8,), dtype, 40), _rand(shape, dtype, 41)
    w, b = _rand(cols, dtype, 42), _rand(cols, dtype, 43)
    for x in (base[: rows * cols].view(rows, cols), base[1: 1 + rows * cols].view(rows, cols)):
        for want_w, want_b in ((True, False), (False, True), (True, True)):
            args = [_leaf(x), _leaf(w, want_w), _leaf(b, want_b)]
            refs = [_leaf(t.double(), r) for t, r in zip((x, w, b), (True, want_w, want_b))]
            yr = F.layer_norm(refs[0], (cols,), refs[1], refs[2], 1e-5)
            want = torch.autograd.grad(yr, [t for t in refs if t.requires_grad], g.double())
            got = torch.autograd.grad(ops.layer_norm(args[0], (cols,), args[1], args[2], 1e-5),
                                      [t for t in args if t.requires_grad], g)
            for a, e in zip(got, want):
                _close(a, e, dtype, scale=math.sqrt(rows), what=f"layer_norm {want_w, want_b}")
            _, mean, rstd = _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)  # the Python path
            dx, dw, db = _norms.layer_norm_bwd(g, x, [cols], mean, rstd, want_w, want_b, w)
            _close(dx, want[0], dtype, what="layer_norm grad x (Python path)")
            if want_w:
                _close(dw, want[1], dtype, scale=math.sqrt(rows), what="layer_norm grad w (Python path)")
            if want_b:
                _close(db, want[-1], dtype, scale=math.sqrt(rows), what="layer_norm grad b (Python path)")
        for want_w in (True, False):
            args, refs = [_leaf(x), _leaf(w, want_w)], [_leaf(x.double()), _leaf(w.double(), want_w)]
            eps = torch.finfo(dtype).eps
            want = torch.autograd.grad(F.rms_norm(refs[0], (cols,), refs[1], eps),
                                       [t for t in refs if t.requires_grad], g.double())
            got = torch.autograd.grad(ops.rms_norm(args[0], (cols,), args[1]), [t for t in args if t.requires_grad],
                                      g)
            for a, e in zip(got, want):
                _close(a, e, dtype, scale=math.sqrt(rows), what=f"rms_norm {want_w}")
            _, rstd = _norms.rms_norm_fwd(x, [cols], w, eps)
            dx, dw = _norms.rms_norm_bwd(g, x, [cols], rstd, want_w, w, grad_residual=g)  # add_rms_norm's
            _close(dx, want[0] + g.double(), dtype, scale=2, what="rms_norm grad x + residual's")
            if want_w:
                _close(dw, want[1], dtype, scale=math.sqrt(rows), what="rms_norm grad w (Python path)")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_layer_norm_wide_kernel_and_misaligned_rows(dtype):
    """Rows of 256+ threads take layer_norm_fwd_wide when 16-byte access is possible; a misaligned view
    takes layer_norm_fwd's element path; the wide kernel itself is right on any row (its element path)."""
    from opsmith.ops import _sources
    rows, cols = 6, 2048 if dtype == torch.float64 else 4096  # 512 or 256 threads a row
    base = _rand((rows * cols + 8,), dtype, 30)
    w, b = _rand(cols, dtype, 31), _rand(cols, dtype, 32)
    for x in (base[: rows * cols].view(rows, cols), base[1: 1 + rows * cols].view(rows, cols)):  # aligned, not
        want = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
        _close(ops.layer_norm(x, (cols,), w, b, 1e-5), want, dtype, what="layer_norm")
        plan = _launch.row_plan(rows, cols, x.element_size(), 1, _launch.device_props(0))
        assert plan.strategy == "block" and plan.block[0] >= _launch.LN_WIDE_TPR
        y = torch.full_like(x, float("nan"))
        mean, rstd = (torch.empty(rows, device="cuda", dtype=torch.float64 if dtype == torch.float64 else torch.float32)
                      for _ in range(2))
        k = _sources.kernel("norm.cu", "layer_norm_fwd_wide<{T}, {A}>", str(dtype).split(".")[1], 0)
        k.launch(_launch.launch_config(plan), x, w, b, y, mean, rstd, rows, cols, 1e-5, 1, 1)
        _close(y, want, dtype, what="layer_norm_fwd_wide launched directly")


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DT_IDS[:3])
@pytest.mark.parametrize("cols", [4096, 6144, 8192, 12288, 16384, 20000, 65536])
def test_norm_l2_forwards_and_their_fallbacks_match_float64(cols, dtype):
    """Rows of 16 KiB or more in whole 16-byte vectors have an L2 plan (norm_l2.cu's forwards take them, but
    the 16 KiB rows that norm_c4_plan serves, float layer_norm at 4,096 here, and where the device's bandwidth an SM
    is low the rows past 16 KiB up to 32 KiB that norm_c8_plan serves: 6,144 and 8,192 float, 12,288 and 16,384
    16-bit; on the H200 those take the kernels of B = 3, bf16 layer_norm's B = 2); a misaligned view of the same
    rows takes the other kernels; all match float64 torch, mean and rstd too, with and without weight and
    bias."""
    from opsmith.ops import _norms
    rows = 5
    base = _rand((rows * cols + 8,), dtype, 40) * 2 + 3
    w, b = _rand(cols, dtype, 41), _rand(cols, dtype, 42)
    for x in (base[: rows * cols].view(rows, cols), base[1: 1 + rows * cols].view(rows, cols)):  # aligned, not
        plan = _launch_norm.norm_l2_plan(rows, cols, x.element_size(), _launch.device_props(0))
        assert (plan is not None) == (cols * x.element_size() >= _launch.L2_MIN_ROW_BYTES)
        xd = x.double()
        for weight, bias in ((w, b), (None, None)):
            y, mean, rstd = _norms.layer_norm_fwd(x, [cols], weight, bias, 1e-5)
            want = F.layer_norm(xd, (cols,), _or_none(weight), _or_none(bias), 1e-5)
            _close(y, want, dtype, what=f"layer_norm (aligned: {x.data_ptr() % 16 == 0})")
            _close(mean, xd.mean(-1), torch.float32, what="layer_norm mean")
            _close(rstd, (xd.var(-1, unbiased=False) + 1e-5).rsqrt(), torch.float32, what="layer_norm rstd")
            y, rstd = _norms.rms_norm_fwd(x, [cols], weight, 1e-6)
            _close(y, F.rms_norm(xd, (cols,), _or_none(weight), 1e-6), dtype, what="rms_norm")
            _close(rstd, (xd.square().mean(-1) + 1e-6).rsqrt(), torch.float32, what="rms_norm rstd")


def _or_none(t):
    return t.double() if t is not None else None


@pytest.mark.parametrize("cols", [4100, 6144, 8192])
def test_norm_bwd_c4_and_its_misaligned_fallback_match_float64(cols):
    """Float rows of 4,097-8,192 columns in whole 16-byte vectors (layer_norm's past 20 KiB: 4,100 keeps the
    clusters) take the 4-chunk backwards (norm.cu's *_bwd_c4, the sums in shared memory) where grad, x, the weight
    and grad_x start 16-byte aligned, the clusters where not; both match float64 torch, with and without weight and
    bias, the residual's gradient added (add_layer_norm's and add_rms_norm's)."""
    rows, dtype = 300, torch.float32
    props = _launch.device_props(0)
    assert _launch_bwd.norm_bwd_c4_plan(rows, cols, 4, props, 1).strategy == "c4"
    ln = _launch_bwd.norm_bwd_c4_plan(rows, cols, 4, props, 2)
    assert (ln is not None and ln.strategy == "c4") == (cols * 4 > _launch.BWD_C4_LN_MIN_ROW_BYTES)
    _norm_bwds_match_float64(rows, cols, dtype)


@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 5120), (torch.bfloat16, 4608), (torch.float32, 2560),
                                         (torch.float32, 2304)], ids=["bf16-5120", "bf16-4608", "f32-2560", "f32-2304"])
def test_norm_bwd_sm_and_its_misaligned_fallback_match_float64(dtype, cols):
    """Rows of 288-320 threads that fill them (16-bit layer_norm's not) take the persistent backwards at two blocks an
    SM (norm.cu's *_bwd_sm, the sums and the weight in shared memory, 96 registers) where grad, x, the weight and
    grad_x start 16-byte aligned, the one-block kernels where not; both match float64 torch, with and without weight
    and bias, the residual's gradient added (add_layer_norm's and add_rms_norm's). 2,001 rows: blocks of 7 and 8
    rows, one odd."""
    from opsmith.ops import _norms
    rows, props = 2001, _launch.device_props(0)
    for arrays in (1, 2):
        p = _launch_bwd.norm_bwd_sm_plan(rows, cols, dtype.itemsize, props, arrays)
        two = arrays == 1 or dtype == torch.float32  # 16-bit layer_norm keeps the one-block kernels
        assert (p is not None and p.strategy == "sm" and p.grid == (2 * props.sm_count,)) == two, p
        flat = torch.empty(rows * cols + 8, dtype=dtype, device="cuda")
        for off, want in ((0, "sm" if two else "persistent"), (1, "persistent")):  # _norm_bwds_match_float64's
            t = flat[off: off + rows * cols].view(rows, cols)
            assert _norms._bwd_plan(rows, cols, t, arrays, t, t, t[0], t)[0].strategy == want
    _norm_bwds_match_float64(rows, cols, dtype)


def _norm_bwds_match_float64(rows, cols, dtype):
    """layer_norm's and rms_norm's backwards of rows x cols, grad and x 16-byte aligned and not, against float64
    torch's: with weight and bias, weight alone, neither; the residual's gradient added or not."""
    from opsmith.ops import _norms
    base = _rand((2 * rows * cols + 8,), dtype, 43)
    xs = base * 2 + 0.5
    w, b = _rand(cols, dtype, 44), _rand(cols, dtype, 45)
    for off in (0, 1):  # aligned, not
        x = xs[off: off + rows * cols].view(rows, cols)
        g = base[rows * cols + off: rows * cols + off + rows * cols].view(rows, cols)
        assert (x.data_ptr() % 16 == 0) == (off == 0) and (g.data_ptr() % 16 == 0) == (off == 0)
        res = torch.roll(g, 1, 0)
        xd, gd = x.double(), g.double()
        for weight, bias in ((w, b), (w, None), (None, None)):
            y, mean, rstd = _norms.layer_norm_fwd(x, [cols], weight, bias, 1e-5)
            leaves = [t.double().requires_grad_(True) if t is not None else None for t in (x, weight, bias)]
            ref = F.layer_norm(leaves[0], (cols,), leaves[1], leaves[2], 1e-5)
            want = torch.autograd.grad(ref, [t for t in leaves if t is not None], gd)
            for r in (None, res):
                dx, dw, db = _norms.layer_norm_bwd(g, x, [cols], mean, rstd, weight is not None, bias is not None,
                                                   weight, r)
                what = f"layer_norm_bwd (aligned: {off == 0}, residual: {r is not None})"
                _close(dx, want[0] + (r.double() if r is not None else 0), dtype, what=what + " grad x")
                for got, exp in zip([t for t in (dw, db) if t.numel()], want[1:]):
                    _close(got, exp, dtype, scale=math.sqrt(rows), what=what + " grad w/b")
            y, rstd = _norms.rms_norm_fwd(x, [cols], weight, 1e-6)
            leaves = [t.double().requires_grad_(True) if t is not None else None for t in (x, weight)]
            ref = F.rms_norm(leaves[0], (cols,), leaves[1], 1e-6)
            want = torch.autograd.grad(ref, [t for t in leaves if t is not None], gd)
            for r in (None, res):
                dx, dw = _norms.rms_norm_bwd(g, x, [cols], rstd, weight is not None, weight, r)
                what = f"rms_norm_bwd (aligned: {off == 0}, residual: {r is not None})"
                _close(dx, want[0] + (r.double() if r is not None else 0), dtype, what=what + " grad x")
                if weight is not None:
                    _close(dw, want[1], dtype, scale=math.sqrt(rows), what=what + " grad w")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("cols", [7, 256, 1000, 1024, 20000])  # element checks, full warp/block rows, vectors, long
def test_norms_inf_nan_as_torch(cols, dtype):
    x = _rand((4, cols), dtype, 18)
    x[0, 1] = float("nan")
    x[1, 2] = float("inf")
    x[2, 3] = float("-inf")
    for name, ours, ref in (("layer_norm", ops.layer_norm(x, (cols,)), F.layer_norm(x.double(), (cols,))),
                            ("rms_norm", ops.rms_norm(x, (cols,), eps=1e-5),
                             F.rms_norm(x.double(), (cols,), eps=1e-5))):
        torch.testing.assert_close(torch.isnan(ours), torch.isnan(ref), msg=lambda m, name=name: f"{name} NaNs: {m}")
        _close(ours, ref, dtype, what=f"{name} with inf/NaN rows")


# -- gradcheck, strategies, benchmark ------------------------------------------------------------------------
@pytest.mark.parametrize("cols", [1, 5, 64, 300, 2100], ids=lambda c: f"cols{c}")  # 2100 doubles: long rows
def test_gradcheck_float64(cols):
    rows = 3 if cols < 2100 else 1
    fast = cols >= 300
    x = _rand((rows, cols), torch.float64, 19).requires_grad_()
    w = _rand(cols, torch.float64, 20).requires_grad_()
    b = _rand(cols, torch.float64, 21).requires_grad_()
    check = lambda fn, *a: torch.autograd.gradcheck(fn, a, fast_mode=fast)
    assert check(ops.relu, x) and check(ops.gelu, x) and check(lambda t: ops.gelu(t, "tanh"), x)
    assert check(ops.silu, x) and check(lambda t: ops.softmax(t, -1), x)
    assert check(lambda t, a, c: ops.layer_norm(t, (cols,), a, c), x, w, b)
    assert check(lambda t, a: ops.rms_norm(t, (cols,), a, 1e-5), x, w)


def test_the_sweep_covers_every_strategy():
    props = _launch.device_props(torch.cuda.current_device())
    seen = set()
    for rows, cols in ROW_SHAPES:
        for arrays, itemsize in ((1, 4), (2, 4), (1, 2)):
            plan = _launch.row_plan(max(rows, 1), cols, itemsize, arrays, props)
            seen.add((plan.strategy, plan.cache))
            plan = _launch_bwd.norm_bwd_plan(max(rows, 1), cols, itemsize, props)
            seen.add((plan.strategy, plan.cache))
            if plan.strategy == "persistent" and rows > plan.grid[0] * plan.block[1]:
                seen.add("several trips")
            for backward in (False, True):
                cl = _launch_norm.norm_cluster_plan(max(rows, 1), cols, itemsize, props, backward)
                if cl is not None:
                    seen.add(("cluster", cl.cluster))
                    if backward and rows > cl.grid[0] // cl.cluster:
                        seen.add("several cluster trips")
    assert {("warp", 0), ("block", 0), ("long", 1), ("long", 0), ("persistent", 0), ("split", 0),
            "several trips"} <= seen
    if props.clusters:
        assert {("cluster", 2), ("cluster", 8), "several cluster trips"} <= seen, seen


def test_cluster_grids_fit_the_clusters_the_device_holds():
    """_functional._resident on the device: the driver's count of resident clusters (Kernel.active_clusters) for the
    float rms_norm backward of 32,768 columns (8 blocks of 512 threads) is at least one and at most the SMs allow,
    and the fitted plan keeps no more clusters than that."""
    props = _launch.device_props(torch.cuda.current_device())
    if not props.clusters:
        pytest.skip("thread-block clusters need sm_90+")
    from opsmith.ops import _functional, _sources
    plan = _launch_norm.norm_cluster_plan(4096, 32768, 4, props, True)
    k = _sources.kernel("norm_cluster.cu", "rms_norm_bwd_cluster<8, {T}, {A}>", "float32", torch.cuda.current_device())
    held = k.active_clusters(_launch.launch_config(plan))
    assert 1 <= held <= props.sm_count // 8
    assert _functional._resident(k, plan).grid[0] == 8 * min(held, plan.grid[0] // 8)


def test_softmax_cluster_grids_fit_the_clusters_the_device_holds():
    """softmax's 4-block cluster forward (16-bit rows of 16,385-20,480) and 2-block backward take at most the clusters
    the driver says the device holds at once (_functional._resident, as the norms'), and still compute every row."""
    props = _launch.device_props(torch.cuda.current_device())
    if not props.clusters:
        pytest.skip("thread-block clusters need sm_90+")
    from opsmith.ops import _functional, _sources
    for arrays, cols, name in ((1, 18000, "softmax_fwd_cluster<{K}, {C}, {{T}}>"),  # (18,432's backward: whole
                               (2, 18000, "softmax_bwd_cluster<{K}, {C}, {{T}}>")):  # warps, "wide")
        plan = _launch.softmax_plan(4096, cols, 2, arrays, props)
        assert plan.strategy == "cluster"
        k = _sources.kernel("softmax_cluster.cu", name.format(K=plan.cluster, C=plan.chunks), "bfloat16",
                            torch.cuda.current_device())
        held = k.active_clusters(_launch.launch_config(plan))
        assert 1 <= held and held * plan.cluster * plan.block[0] <= props.sm_count * props.max_threads_per_sm
        fitted = _functional._resident(k, plan)
        assert fitted.grid[0] == plan.cluster * min(held, plan.grid[0] // plan.cluster)
    x = torch.randn(4096, 18000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = ops.softmax(x, -1)
    torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=2e-2)
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, g)
    yr = torch.softmax(x.double(), -1)
    want = yr * (g.double() - (g.double() * yr).sum(-1, keepdim=True))
    torch.testing.assert_close(dx.double(), want, atol=2e-3, rtol=3e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_l2_rows_of_one_block_an_sm_hold_one_block_an_sm(dtype):
    """norm_l2.cu's kernels of B = 1 (rows past 80 KiB; their plans pad no shared memory): the driver's occupancy of
    a block of 1,024 threads is one an SM, for each of the three forwards (a second block's row would overflow L2)."""
    from opsmith.ops import _launch_norm, _sources
    props = _launch.device_props(torch.cuda.current_device())
    itemsize = 4 if dtype == "float32" else 2
    plan = _launch_norm.norm_l2_plan(64, 131072 // itemsize, itemsize, props)
    if plan is None or not plan.chunks:
        pytest.skip(f"this device's blocks take fewer than {_launch.L2_THREADS} threads")
    assert plan.block == (_launch.L2_THREADS, 1) and plan.shared_mem == 0
    for op in ("layer_norm", "rms_norm", "add_rms_norm"):
        k = _sources.kernel("norm_l2.cu", _launch_norm.l2_kernel(op, plan), dtype, torch.cuda.current_device())
        assert k.occupancy(_launch.L2_THREADS, 0) == 1, op


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_l2_rows_of_three_blocks_an_sm_hold_three_blocks_of_512_an_sm(dtype):
    """norm_l2.cu's kernels of B = 3 (rows past 16 up to 32 KiB where the plans give them: the H200): the driver's
    occupancy of a block of 512 threads is three an SM (40 registers), for rms_norm's and layer_norm's forwards."""
    from opsmith.ops import _launch_norm, _sources
    props = _launch.device_props(torch.cuda.current_device())
    itemsize = 4 if dtype == "float32" else 2
    plan = _launch_norm.norm_l2_plan(64, 32768 // itemsize, itemsize, props, 1)
    if plan is None or plan.chunks != _launch.L2_THREE_CHUNKS:
        pytest.skip("this device's plans keep B = 2 on rows of 32 KiB (its DRAM bandwidth an SM is not the H200's)")
    assert plan.block == (_launch.L2_THREE_THREADS, 1) and plan.shared_mem == 0
    for op in ("layer_norm", "rms_norm"):
        k = _sources.kernel("norm_l2.cu", f"{op}_fwd_l2<3, {{T}}, {{A}}>", dtype, torch.cuda.current_device())
        assert k.occupancy(_launch.L2_THREE_THREADS, 0) == 3, op


def test_benchmark_helper_reports_bandwidth():
    x = torch.randn(1 << 24, device="cuda")
    r = ops.benchmark(ops.relu, x, bytes_moved=2 * x.nbytes, runs=20)
    assert r.runs == 20 and r.median_ms > 0 and 0.2 < r.fraction < 1.2, r
    assert ops.copy_bandwidth() == r.copy_gbps
    assert "GB/s" in str(r)


# -- the torch operators -----------------------------------------------------------------------------------
def _cuda_cases(dtype):
    x = _rand((4, 3, 300), dtype, 30)
    x2 = _rand((4, 3, 300), dtype, 31)
    w, b = _rand(300, dtype, 32), _rand(300, dtype, 33)
    stats = torch.float64 if dtype == torch.float64 else torch.float32
    mean = _rand(12, stats, 34)
    rstd = mean.abs() + 0.5
    return [("relu", (x,)), ("relu_backward", (x2, x)), ("gelu", (x,)), ("gelu", (x, "tanh")),
            ("gelu_backward", (x2, x, "none")), ("silu", (x,)), ("silu_backward", (x2, x)), ("softmax", (x,)),
            ("softmax", (x, 1)), ("softmax_backward", (x2, torch.softmax(x, 0), 0)),
            ("layer_norm", (x, [300], w, b, 1e-5)), ("layer_norm", (x, [3, 300], None, None, 1e-3)),
            ("layer_norm_backward", (x2, x, [300], mean, rstd, True, True, w)),
            ("rms_norm", (x, [300], w, None)), ("rms_norm_backward", (x2, x, [300], rstd, True, w))]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_opcheck_every_op_on_cuda(dtype):
    from opsmith.ops._register import OP_NAMES, ops as registered
    T = registered()
    cases = _cuda_cases(dtype)
    assert {n for n, _ in cases} == set(OP_NAMES)
    rtol, atol = TOL[dtype]
    for name, args in cases:
        args = tuple(a.detach().clone().requires_grad_(not name.endswith("backward"))
                     if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        result = torch.library.opcheck(getattr(T, name).default, args, rtol=max(rtol, 1e-5), atol=max(atol, 1e-5))
        assert set(result.values()) == {"SUCCESS"}, (name, result)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_torch_compile_fullgraph_with_inductor(dtype):
    torch._dynamo.reset()
    x = _rand((64, 512), dtype, 40).requires_grad_()
    w = _rand(512, dtype, 41).requires_grad_()

    def f(x, w):
        h = ops.gelu(ops.silu(ops.relu(x) + x), "tanh")
        return ops.rms_norm(ops.softmax(ops.layer_norm(h, 512, w, w), -1), 512, w)

    out = torch.compile(f, fullgraph=True)(x, w)  # fullgraph: a graph break raises
    ref = f(x, w)
    _close(out, ref, dtype, what="compiled vs eager")
    g = torch.autograd.grad(out.float().sum(), (x, w))
    r = torch.autograd.grad(ref.float().sum(), (x, w))
    _close(g[0], r[0], dtype, what="compiled grad x")
    _close(g[1], r[1], dtype, scale=8, what="compiled grad w")
