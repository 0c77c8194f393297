"""add_rms_norm and add_layer_norm on CUDA: the new residual bitwise equal to torch's x + residual, y against a
float64 reference for every dtype, on the one-kernel paths (rows in registers, 16-byte vectors or not, 2 and 4
chunks a thread) and the long-row paths (an add and the norm's long kernels); gradients (the residual's gradient
added inside the backward kernels or after them); gradcheck; opcheck; compile."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import opsmith.ops as O

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1.6e-2)}


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
# (5, 16384), (3, 12000), (4, 32768): add_rms_c8_plan's 8-chunk rows (16-bit: 256 threads, whole and checked
# chunks, and 512 threads; float: 512 threads, then the L2 rows); (2048, 1024), (1536, 4096): more rows than
# norm_bwd_small_plan's, the persistent and split backwards with the residual's gradient; (300, 6144): float's 4-chunk
# backward (norm_bwd_c4_plan)
@pytest.mark.parametrize("shape", [(1, 8), (7, 100), (64, 4096), (3, 5, 2048), (2, 70000), (0, 16), (5, 16384),
                                   (3, 12000), (4, 32768), (2048, 1024), (1536, 4096), (300, 6144)])
@pytest.mark.parametrize("weight", [True, False])
def test_matches_torch(dtype, shape, weight):
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True) if weight else None
    y, s = O.add_rms_norm(x, r, shape[-1], w, 1e-6)
    assert torch.equal(s, x.detach() + r.detach())  # the residual stream: T's own rounding of the sum
    s64 = s.detach().double()
    want = F.rms_norm(s64, [shape[-1]], w.detach().double() if weight else None, 1e-6)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)
    if x.numel():
        gy, gs = torch.randn_like(y), torch.randn_like(s)
        leaves = [t for t in (x, r, w) if t is not None]
        got = torch.autograd.grad((y * gy).sum() + (s * gs).sum(), leaves)
        xs = s.detach().double().requires_grad_()
        w64 = w.detach().double().requires_grad_() if weight else None
        ref = F.rms_norm(xs, [shape[-1]], w64, 1e-6)
        exp = torch.autograd.grad((ref * gy.double()).sum() + (xs * gs.double()).sum(),
                                  [xs] + ([w64] if weight else []))
        torch.testing.assert_close(got[0].double(), exp[0], atol=8 * atol, rtol=8 * rtol)
        torch.testing.assert_close(got[1].double(), exp[0], atol=8 * atol, rtol=8 * rtol)
        if weight:
            torch.testing.assert_close(got[2].double(), exp[1], atol=8 * atol * shape[0], rtol=8 * rtol)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("cols", [256, 1024, 1536, 3072, 5120, 7680, 10240, 12288])
def test_rows_that_fill_their_chunks_aligned_or_not(dtype, cols):
    """add_rms_norm_fwd_full takes the register rows that fill their threads' chunks when x, the residual and the
    weight are 16-byte aligned (the rows of whole warps at exactly their threads: 1,536 to 7,680, _launch._whole_warps;
    10,240 and 12,288 at 8 chunks, add_rms_c8_plan); a view one element in takes add_rms_norm_fwd's element path:
    both match torch."""
    flat = torch.randn(5 * cols + 1, device="cuda", dtype=dtype)
    r = torch.randn(5, cols, device="cuda", dtype=dtype)
    w = torch.randn(cols, device="cuda", dtype=dtype)
    atol, rtol = TOL[dtype]
    for x in (flat[:-1].view(5, cols), flat[1:].view(5, cols)):
        y, s = O.add_rms_norm(x, r, cols, w, 1e-6)
        assert torch.equal(s, x + r)
        torch.testing.assert_close(y.double(), F.rms_norm(s.double(), [cols], w.double(), 1e-6), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
# element checks, full warp rows, vectors, a full block row, sm_90+'s clusters (2 and 4 chunks a thread)
@pytest.mark.parametrize("cols", [7, 256, 1000, 4096, 12000, 32768])
def test_inf_nan_make_the_row_nan(dtype, cols):
    x = torch.randn(8, cols, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    x[0, 1], x[1, 2], r[2, 3] = float("nan"), float("inf"), float("-inf")
    y, s = O.add_rms_norm(x, r, cols, None, 1e-6)
    torch.testing.assert_close(s, x + r, equal_nan=True, atol=0, rtol=0)
    assert torch.isnan(y[:3]).all(), "a row holding inf or NaN is NaN, as rms_norm's"
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y[3:].double(), F.rms_norm(s[3:].double(), [cols], None, 1e-6), atol=atol, rtol=rtol)


def test_gradcheck_opcheck_compile():
    x = torch.randn(3, 40, device="cuda", dtype=torch.float64, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.randn(40, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: O.add_rms_norm(a, b, 40, c, 1e-5), (x, r, w))
    from opsmith.ops._register import ops
    T = ops()
    assert set(torch.library.opcheck(T.add_rms_norm.default, (x, r, [40], w, 1e-5)).values()) == {"SUCCESS"}
    f = torch.compile(lambda a, b: O.add_rms_norm(a, b, 4096)[0].float().sum(), fullgraph=True, dynamic=False)
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    torch.testing.assert_close(f(a, b), F.rms_norm((a + b).float(), [4096], eps=torch.finfo(torch.bfloat16).eps).sum(),
                               atol=2.0, rtol=1e-2)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
# (1, 8), (7, 100): warp rows, element checks; (512, 1024): layer_norm_full2_plan's rows (16-bit); (2048, 1024),
# (64, 4096), (3, 5, 2048), (16, 8192): norm_c4_plan's (16-bit and float to 16 KiB; 8192 float: 2 chunks);
# (4096, 768): 2 chunks, not full; (5, 16384), (3, 12000), (600, 16384), (2, 70000): the L2 rows
# (add_layer_norm_fwd_l2, 2 and 1 blocks an SM); (300, 12001): odd long rows (an add, then layer_norm); (2048, 1024),
# (1536, 4096), (4096, 768): the persistent backward with the residual's gradient (layer_norm_bwd_res), (600, 16384),
# (300, 12001) the clusters' or the long rows' (*_res), the few rows the small and split backwards, the gradient
# added after; (16, 8192), (300, 6144): float's 4-chunk backward (layer_norm_bwd_c4_res)
@pytest.mark.parametrize("shape", [(1, 8), (7, 100), (512, 1024), (2048, 1024), (64, 4096), (3, 5, 2048), (16, 8192),
                                   (4096, 768), (1536, 4096), (5, 16384), (3, 12000), (600, 16384), (300, 12001),
                                   (2, 70000), (0, 16), (300, 6144)])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_add_layer_norm_matches_torch(dtype, shape, affine):
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True) if affine != "none" else None
    b = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True) if affine == "wb" else None
    y, s = O.add_layer_norm(x, r, shape[-1], w, b, 1e-5)
    assert torch.equal(s, x.detach() + r.detach())  # the residual stream: T's own rounding of the sum
    atol, rtol = TOL[dtype]
    xs = s.detach().double().requires_grad_()
    p64 = [t.detach().double().requires_grad_() if t is not None else None for t in (w, b)]
    ref = F.layer_norm(xs, [shape[-1]], *p64, 1e-5)
    torch.testing.assert_close(y.double(), ref, atol=atol, rtol=rtol)
    if not x.numel():
        return
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    leaves = [t for t in (x, r, w, b) if t is not None]
    got = torch.autograd.grad((y * gy).sum() + (s * gs).sum(), leaves)
    exp = torch.autograd.grad((ref * gy.double()).sum() + (xs * gs.double()).sum(),
                              [xs] + [t for t in p64 if t is not None])
    rows = x.numel() // shape[-1]
    torch.testing.assert_close(got[0].double(), exp[0], atol=8 * atol, rtol=8 * rtol)
    torch.testing.assert_close(got[1].double(), exp[0], atol=8 * atol, rtol=8 * rtol)
    for g, e in zip(got[2:], exp[1:]):
        torch.testing.assert_close(g.double(), e, atol=8 * atol * rows ** 0.5 * 4, rtol=8 * rtol)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("cols", [256, 1024, 2048, 4096])
def test_add_layer_norm_rows_aligned_or_not(dtype, cols):
    """The unchecked rows (add_layer_norm_fwd_full, add_layer_norm_fwd_c4_full) where x, the residual, the weight and
    the bias are 16-byte aligned; a view one element in takes the element path; the persistent backward's vectors
    and elements likewise (the residual's gradient one element in): all match torch."""
    rows = 600
    flat = torch.randn(rows * cols + 1, device="cuda", dtype=dtype)
    r = torch.randn(rows, cols, device="cuda", dtype=dtype)
    w, b = torch.randn(cols, device="cuda", dtype=dtype), torch.randn(cols, device="cuda", dtype=dtype)
    atol, rtol = TOL[dtype]
    for x in (flat[:-1].view(rows, cols), flat[1:].view(rows, cols)):
        xx = x.detach().requires_grad_()
        y, s = O.add_layer_norm(xx, r, cols, w, b, 1e-5)
        assert torch.equal(s, x + r)
        s64 = s.detach().double().requires_grad_()
        ref = F.layer_norm(s64, [cols], w.double(), b.double(), 1e-5)
        torch.testing.assert_close(y.double(), ref, atol=atol, rtol=rtol)
        gy = torch.randn_like(y)
        gs = torch.randn(rows * cols + 1, device="cuda", dtype=dtype)[1:].view(rows, cols)  # one element in
        got, = torch.autograd.grad([y, s], [xx], [gy, gs])
        exp, = torch.autograd.grad([ref, s64], [s64], [gy.double(), gs.double()])
        torch.testing.assert_close(got.double(), exp, atol=8 * atol, rtol=8 * rtol)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("cols", [7, 256, 1024, 4096, 8192, 70000])
def test_add_layer_norm_inf_nan_make_the_row_nan(dtype, cols):
    x = torch.randn(8, cols, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    x[0, 1], x[1, 2], r[2, 3] = float("nan"), float("inf"), float("-inf")
    y, s = O.add_layer_norm(x, r, cols, None, None, 1e-5)
    torch.testing.assert_close(s, x + r, equal_nan=True, atol=0, rtol=0)
    assert torch.isnan(y[:3]).all(), "a row holding inf or NaN is NaN, as torch's layer_norm"
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y[3:].double(), F.layer_norm(s[3:].double(), [cols], None, None, 1e-5), atol=atol,
                               rtol=rtol)


def test_add_layer_norm_gradcheck_opcheck_compile():
    x = torch.randn(3, 40, device="cuda", dtype=torch.float64, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.randn(40, device="cuda", dtype=torch.float64, requires_grad=True)
    b = torch.randn(40, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c, d, e: O.add_layer_norm(a, c, 40, d, e, 1e-5), (x, r, w, b))
    from opsmith.ops._register import ops
    T = ops()
    assert set(torch.library.opcheck(T.add_layer_norm.default, (x, r, [40], w, b, 1e-5)).values()) == {"SUCCESS"}
    f = torch.compile(lambda a, c: O.add_layer_norm(a, c, 4096)[0].float().sum(), fullgraph=True, dynamic=False)
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    c = torch.randn_like(a)
    torch.testing.assert_close(f(a, c), F.layer_norm((a + c).float(), [4096]).sum(), atol=2.0, rtol=1e-2)
