"""add_rms_norm (and add_layer_norm: an add and layer_norm's kernels) on CUDA: the new residual bitwise equal to torch's x + residual, y against a
float64 reference for every dtype, on the one-kernel path (rows in registers, 16-byte vectors
or not) and the long-row path (an add and rms_norm's long kernel); gradients; gradcheck;
opcheck; compile."""
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
# norm_bwd_small_plan's, the persistent and split backwards with the residual's gradient
@pytest.mark.parametrize("shape", [(1, 8), (7, 100), (64, 4096), (3, 5, 2048), (2, 70000), (0, 16), (5, 16384),
                                   (3, 12000), (4, 32768), (2048, 1024), (1536, 4096)])
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
@pytest.mark.parametrize("cols", [256, 1024])
def test_rows_that_fill_their_chunks_aligned_or_not(dtype, cols):
    """add_rms_norm_fwd_full takes the register rows that fill their threads' chunks when x, the residual and the
    weight are 16-byte aligned; a view one element in takes add_rms_norm_fwd's element path: both match torch."""
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
@pytest.mark.parametrize("shape", [(7, 100), (64, 4096), (2, 70000)])
def test_add_layer_norm_matches_torch(dtype, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
    y, s = O.add_layer_norm(x, r, shape[-1], w, b, 1e-5)
    assert torch.equal(s, x.detach() + r.detach())
    atol, rtol = TOL[dtype]
    xs = s.detach().double().requires_grad_()
    w64, b64 = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref = F.layer_norm(xs, [shape[-1]], w64, b64, 1e-5)
    torch.testing.assert_close(y.double(), ref, atol=atol, rtol=rtol)
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    got = torch.autograd.grad((y * gy).sum() + (s * gs).sum(), [x, r, w, b])
    exp = torch.autograd.grad((ref * gy.double()).sum() + (xs * gs.double()).sum(), [xs, w64, b64])
    torch.testing.assert_close(got[0].double(), exp[0], atol=8 * atol, rtol=8 * rtol)
    torch.testing.assert_close(got[1].double(), exp[0], atol=8 * atol, rtol=8 * rtol)
    torch.testing.assert_close(got[2].double(), exp[1], atol=8 * atol * shape[0], rtol=8 * rtol)
    torch.testing.assert_close(got[3].double(), exp[2], atol=8 * atol * shape[0], rtol=8 * rtol)
