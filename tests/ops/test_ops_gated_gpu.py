"""The gated activations on CUDA: silu_and_mul / gelu_and_mul (packed) and silu_mul / gelu_mul
(gate and up as two tensors): forward and backward against a float64 reference for every dtype,
on shapes that take the 16-byte vector path (d a multiple of the vector width) and the element
path (odd d, a view at an odd offset, halves whose row stride is not a multiple of the width);
non-contiguous halves read in place; gradcheck in float64; opcheck; compile."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import opsmith.ops as O

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1.6e-2)}
KINDS = {"silu": (lambda x: O.silu_and_mul(x), lambda g: F.silu(g)),
         "gelu": (lambda x: O.gelu_and_mul(x), lambda g: F.gelu(g)),
         "gelu_tanh": (lambda x: O.gelu_and_mul(x, "tanh"), lambda g: F.gelu(g, approximate="tanh"))}


def _ref(x, act):
    d = x.shape[-1] // 2
    return act(x[..., :d]) * x[..., d:]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("shape", [(1, 2), (7, 6), (64, 2 * 4096), (3, 5, 2 * 11008), (1000, 2 * 127), (0, 8)])
def test_matches_float64_reference(kind, dtype, shape):
    ours, act = KINDS[kind]
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    y = ours(x)
    x64 = x.detach().double().requires_grad_()
    want = _ref(x64, act)
    atol, rtol = TOL[dtype]
    assert y.dtype == dtype and y.shape == want.shape
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)
    if x.numel():
        g = torch.randn_like(y)
        (got,) = torch.autograd.grad(y, x, g)
        (exp,) = torch.autograd.grad(want, x64, g.double())
        torch.testing.assert_close(got.double(), exp, atol=4 * atol, rtol=4 * rtol)


def test_unaligned_and_strided_inputs():
    base = torch.randn(4 * 16 + 1, device="cuda")
    x = base[1:].view(4, 16)  # 4-byte offset: the element path
    torch.testing.assert_close(O.silu_and_mul(x), _ref(x, F.silu))
    xt = torch.randn(16, 4, device="cuda").t()  # non-contiguous: made contiguous first
    torch.testing.assert_close(O.gelu_and_mul(xt), _ref(xt, F.gelu))


def test_gradcheck_opcheck_compile():
    x = torch.randn(3, 10, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(O.silu_and_mul, (x,))
    assert torch.autograd.gradcheck(lambda t: O.gelu_and_mul(t, "tanh"), (x,))
    from opsmith.ops._register import ops
    T = ops()
    g = torch.randn(3, 5, device="cuda", dtype=torch.float64)
    for op, args in [(T.silu_and_mul, (x,)), (T.gelu_and_mul, (x, "none")),
                     (T.silu_and_mul_backward, (g, x.detach())), (T.gelu_and_mul_backward, (g, x.detach(), "tanh"))]:
        assert set(torch.library.opcheck(op.default, args).values()) == {"SUCCESS"}
    f = torch.compile(lambda t: O.silu_and_mul(t).sum(), fullgraph=True, dynamic=False)
    xb = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(f(xb).float(), _ref(xb, F.silu).float().sum(), atol=0.5, rtol=1e-2)


PAIRS = {"silu": (lambda a, b: O.silu_mul(a, b), F.silu), "gelu": (lambda a, b: O.gelu_mul(a, b), F.gelu),
         "gelu_tanh": (lambda a, b: O.gelu_mul(a, b, "tanh"), lambda g: F.gelu(g, approximate="tanh"))}


def _pairs(d, dtype):
    """(name, gate, up) on CUDA: two tensors, the halves of a packed tensor, halves at an odd
    offset (unaligned), a transposed gate (copied), an expanded up, a large batch."""
    kw = {"device": "cuda", "dtype": dtype}
    packed = torch.randn(33, 2 * d, **kw)
    odd = torch.randn(3, 11, 2 * d + 1, **kw)[..., 1:]
    return [("two", torch.randn(33, d, **kw), torch.randn(33, d, **kw)),
            ("halves", packed[:, :d], packed[:, d:]),
            ("unaligned halves", odd[..., :d], odd[..., d:]),
            ("transposed", torch.randn(d, 33, **kw).t(), torch.randn(33, d, **kw)),
            ("expanded", torch.randn(33, d, **kw), torch.randn(d, **kw).expand(33, d)),
            ("batch", torch.randn(4, 256, d, **kw), torch.randn(4, 256, d, **kw))]


@pytest.mark.parametrize("kind", sorted(PAIRS))
@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("d", [1, 7, 8, 127, 4096, 5632])
def test_pair_matches_float64_reference(kind, dtype, d):
    ours, act = PAIRS[kind]
    atol, rtol = TOL[dtype]
    for name, a, b in _pairs(d, dtype):
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        y = ours(a, b)
        a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        want = act(a64) * b64
        assert y.dtype == dtype and y.shape == want.shape, name
        torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol, msg=name)
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, (a, b), g)
        exp = torch.autograd.grad(want, (a64, b64), g.double())
        for u, e in zip(got, exp):
            torch.testing.assert_close(u.double(), e, atol=4 * atol, rtol=4 * rtol, msg=name)


def test_pair_reads_halves_in_place_and_matches_the_packed_op():
    x = torch.randn(64, 2 * 4096, device="cuda", dtype=torch.bfloat16)
    a, b = x[:, :4096], x[:, 4096:]
    assert not a.is_contiguous()
    torch.testing.assert_close(O.silu_mul(a, b), O.silu_and_mul(x), atol=0, rtol=0)  # one kernel, one rounding
    torch.testing.assert_close(O.gelu_mul(a, b, "tanh"), O.gelu_and_mul(x, "tanh"), atol=0, rtol=0)


def test_pair_gradcheck_opcheck_compile():
    x = torch.randn(3, 10, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: O.silu_mul(t[:, :5], t[:, 5:]), (x,))
    assert torch.autograd.gradcheck(lambda t: O.gelu_mul(t[:, 5:], t[:, :5], "tanh"), (x,))
    from opsmith.ops._register import ops
    T = ops()
    a, b = x.detach()[:, :5], x.detach()[:, 5:]
    g = torch.randn(3, 5, device="cuda", dtype=torch.float64)
    for op, args in [(T.silu_mul, (a, b)), (T.gelu_mul, (a, b, "none")), (T.silu_mul_backward, (g, a, b)),
                     (T.gelu_mul_backward, (g, a, b, "tanh"))]:
        assert set(torch.library.opcheck(op.default, args).values()) == {"SUCCESS"}
    f = torch.compile(lambda u, v: O.silu_mul(u, v).sum(), fullgraph=True, dynamic=False)
    ub, vb = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16), torch.randn(8, 256, device="cuda",
                                                                                   dtype=torch.bfloat16)
    torch.testing.assert_close(f(ub, vb).float(), (F.silu(ub.float()) * vb.float()).sum(), atol=0.5, rtol=1e-2)
