"""add_rms_norm (fused residual add + RMSNorm) and add_layer_norm on CPU: values and gradients against torch,
gradcheck, opcheck of both operators, fake kernels, compile, errors, and its CUDA kernel
compiled by NVRTC for every dtype (no GPU needed)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import opsmith.ops as O
from opsmith._errors import SpecError


def _inputs(shape, weight=True):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    r = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(shape[-1], dtype=torch.float64, requires_grad=True) if weight else None
    return x, r, w


@pytest.mark.parametrize("shape", [(5,), (3, 16), (2, 3, 24)])
@pytest.mark.parametrize("weight", [True, False])
def test_values_and_gradients_match_torch(shape, weight):
    x, r, w = _inputs(shape, weight)
    y, s = O.add_rms_norm(x, r, shape[-1], w, 1e-5)
    s_ref = x + r
    y_ref = F.rms_norm(s_ref, [shape[-1]], w, 1e-5)
    assert torch.allclose(y, y_ref) and torch.allclose(s, s_ref)
    gy, gs = torch.randn_like(y), torch.randn_like(s)  # both outputs feed the loss, as in a block
    leaves = [t for t in (x, r, w) if t is not None]
    got = torch.autograd.grad((y * gy).sum() + (s * gs).sum(), leaves)
    want = torch.autograd.grad((y_ref * gy).sum() + (s_ref * gs).sum(), leaves)
    assert all(torch.allclose(a, b) for a, b in zip(got, want))
    assert torch.autograd.gradcheck(
        lambda *t: O.add_rms_norm(t[0], t[1], shape[-1], t[2] if len(t) > 2 else None, 1e-5), tuple(leaves))


def test_opcheck_fake_and_compile():
    from opsmith.ops._register import FUSED_NAMES, ops
    T = ops()
    assert set(FUSED_NAMES) == {"add_rms_norm", "add_rms_norm_backward", "add_layer_norm", "add_layer_norm_backward"}
    x, r, w = _inputs((4, 8))
    assert set(torch.library.opcheck(T.add_rms_norm.default, (x, r, [8], w, 1e-5)).values()) == {"SUCCESS"}
    _, s, rstd = T.add_rms_norm(x.detach(), r.detach(), [8], w.detach(), 1e-5)
    g = torch.randn(4, 8, dtype=torch.float64)
    for gres in (g, None):
        result = torch.library.opcheck(T.add_rms_norm_backward.default, (g, s, [8], rstd, True, w.detach(), gres))
        assert set(result.values()) == {"SUCCESS"}
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fx = torch.empty(2, 3, 64, dtype=torch.bfloat16)
        y, s, rstd = T.add_rms_norm(fx, fx, [64], None, None)
        assert y.shape == s.shape == fx.shape and rstd.shape == (6,) and rstd.dtype == torch.float32
    f = torch.compile(lambda a, b: O.add_rms_norm(a, b, 8)[0] * 2, fullgraph=True, dynamic=False)
    a, b = torch.randn(3, 8), torch.randn(3, 8)
    assert torch.allclose(f(a, b), F.rms_norm(a + b, [8], eps=torch.finfo(torch.float32).eps) * 2, atol=1e-6)


def test_errors_name_the_fix():
    x = torch.randn(3, 8)
    with pytest.raises(SpecError, match="residual must match x"):
        O.add_rms_norm(x, torch.randn(3, 8, dtype=torch.float64), 8)
    with pytest.raises(SpecError, match="normalized_shape"):
        O.add_rms_norm(x, x, 7)


def test_fused_kernel_compiles_for_every_dtype():
    pytest.importorskip("cuda.bindings.nvrtc")
    from opsmith._build._nvrtc import compile_request, make_request
    from opsmith.ops import _sources
    for job in _sources.jobs("sm_90", files=("fused_norm.cu",)):
        b = compile_request(make_request(**job))
        assert set(b.lowered_names) == set(job["name_expressions"]) and b.code[:4] == b"\x7fELF"


@pytest.mark.parametrize("shape", [(5,), (3, 16), (2, 3, 24)])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_add_layer_norm_values_gradients_opcheck(shape, affine):
    x, r, w = _inputs(shape, affine != "none")
    b = torch.randn(shape[-1], dtype=torch.float64, requires_grad=True) if affine == "wb" else None
    y, s = O.add_layer_norm(x, r, shape[-1], w, b, 1e-5)
    s_ref = x + r
    y_ref = F.layer_norm(s_ref, [shape[-1]], w, b, 1e-5)
    assert torch.allclose(y, y_ref) and torch.allclose(s, s_ref)
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    leaves = [t for t in (x, r, w, b) if t is not None]
    got = torch.autograd.grad((y * gy).sum() + (s * gs).sum(), leaves)
    want = torch.autograd.grad((y_ref * gy).sum() + (s_ref * gs).sum(), leaves)
    assert all(torch.allclose(a, c) for a, c in zip(got, want))
    # only y feeds the loss (the residual output unused): its gradient is None, not an error
    got = torch.autograd.grad(O.add_layer_norm(x, r, shape[-1], w, b)[0].sum(), [x, r])
    want = torch.autograd.grad(F.layer_norm(x + r, [shape[-1]], w, b).sum(), [x, r])
    assert all(torch.allclose(a, c) for a, c in zip(got, want))
    from opsmith.ops._register import ops
    T = ops()
    args = (x.detach(), r.detach(), [shape[-1]], None if w is None else w.detach(), None if b is None else b.detach(),
            1e-5)
    assert set(torch.library.opcheck(T.add_layer_norm.default, args).values()) == {"SUCCESS"}
    _, s2, mean, rstd = T.add_layer_norm(*args)
    g = torch.randn(shape, dtype=torch.float64)
    back = (g, s2, [shape[-1]], mean, rstd, w is not None, b is not None, args[3], g)
    assert set(torch.library.opcheck(T.add_layer_norm_backward.default, back).values()) == {"SUCCESS"}


def test_add_layer_norm_gradcheck_fake_compile_errors():
    x, r, w = _inputs((3, 8))
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: O.add_layer_norm(*t[:2], 8, *t[2:]), (x, r, w, b))
    from opsmith.ops._register import ops
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fx = torch.empty(2, 3, 64, dtype=torch.bfloat16)
        y, s, mean, rstd = ops().add_layer_norm(fx, fx, [64], None, None, 1e-5)
        assert y.shape == s.shape == fx.shape and mean.shape == rstd.shape == (6,) and rstd.dtype == torch.float32
    f = torch.compile(lambda a, c: O.add_layer_norm(a, c, 8)[0] * 2, fullgraph=True, dynamic=False)
    a, c = torch.randn(3, 8), torch.randn(3, 8)
    assert torch.allclose(f(a, c), F.layer_norm(a + c, [8]) * 2, atol=1e-5)
    with pytest.raises(SpecError, match="add_layer_norm: residual must match x"):
        O.add_layer_norm(a, torch.randn(3, 9), 8)
