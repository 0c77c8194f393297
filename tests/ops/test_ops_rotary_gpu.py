"""rotary_embedding on CUDA: neox and interleaved, cos/sin broadcast or indexed by positions,
partial rotary dims, against a float64 reference for every dtype; the backward (the inverse
rotation) against autograd of the reference; gradcheck; opcheck; compile."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import opsmith.ops as O

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1.6e-2)}


def _ref(x, cos, sin, interleaved):
    h = cos.shape[-1]
    if interleaved:
        a, b = x[..., 0:2 * h:2], x[..., 1:2 * h:2]
        rot = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    else:
        a, b = x[..., :h], x[..., h:2 * h]
        rot = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    return torch.cat([rot, x[..., 2 * h:]], -1)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape, half, positions", [((2, 4, 16, 64), 32, False), ((2, 4, 16, 64), 16, False),
                                                     ((37, 8, 128), 64, True), ((1, 1, 1, 2), 1, False)])
def test_matches_float64_reference(dtype, interleaved, shape, half, positions):
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    rows = shape[-2] if not positions else 100
    ang = torch.randn(rows, half, device="cuda", dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()
    pos = torch.randint(0, 100, (shape[0], 1), device="cuda") if positions else None
    y = O.rotary_embedding(x, cos.to(dtype), sin.to(dtype), pos, interleaved=interleaved)
    c = cos.to(dtype).double()[pos] if positions else cos.to(dtype).double()
    s = sin.to(dtype).double()[pos] if positions else sin.to(dtype).double()
    x64 = x.detach().double().requires_grad_()
    want = _ref(x64, c, s, interleaved)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    (exp,) = torch.autograd.grad(want, x64, g.double())
    torch.testing.assert_close(got.double(), exp, atol=2 * atol, rtol=2 * rtol)


def test_gradcheck_opcheck_compile():
    x = torch.randn(3, 2, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    ang = torch.randn(3, 1, 8, device="cuda", dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()
    assert torch.autograd.gradcheck(lambda t: O.rotary_embedding(t, cos, sin), (x,))
    from opsmith.ops._register import ops
    T = ops()
    assert set(torch.library.opcheck(T.rotary_embedding.default, (x, cos, sin, None, True)).values()) == {"SUCCESS"}
    f = torch.compile(lambda t: O.rotary_embedding(t, cos.float(), sin.float()).sum(), fullgraph=True, dynamic=False)
    xf = x.detach().float()
    torch.testing.assert_close(f(xf), _ref(xf, cos.float(), sin.float(), False).sum(), atol=1e-3, rtol=1e-4)
