"""silu_and_mul / gelu_and_mul on CPU: values and gradients against torch's own functions,
opcheck of the four operators, fake kernels, the nn.Modules, errors, and their CUDA kernels
compiled by NVRTC for every dtype (no GPU needed)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import opsmith.ops as O
from opsmith._errors import SpecError


def _ref(x, kind):
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    act = F.silu(gate) if kind == "silu" else F.gelu(gate, approximate="tanh" if kind == "gelu_tanh" else "none")
    return act * up


CASES = [("silu", lambda x: O.silu_and_mul(x)), ("gelu", lambda x: O.gelu_and_mul(x)),
         ("gelu_tanh", lambda x: O.gelu_and_mul(x, "tanh"))]


@pytest.mark.parametrize("kind, f", CASES)
@pytest.mark.parametrize("shape", [(6,), (3, 10), (2, 3, 16), (0, 8)])
def test_values_and_gradients_match_torch(kind, f, shape):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y = f(x)
    want = _ref(x, kind)
    assert y.shape == want.shape and torch.allclose(y, want)
    if x.numel():
        g = torch.randn_like(y)
        (got,) = torch.autograd.grad(y, x, g)
        (exp,) = torch.autograd.grad(want, x, g)
        assert torch.allclose(got, exp)
        assert torch.autograd.gradcheck(f, (x,))


def test_opcheck_fake_and_modules():
    from opsmith.ops._register import GATED_NAMES, ops
    T = ops()
    x = torch.randn(4, 12, dtype=torch.float64)
    g = torch.randn(4, 6, dtype=torch.float64)
    cases = {"silu_and_mul": (x.clone().requires_grad_(),), "gelu_and_mul": (x.clone().requires_grad_(), "tanh"),
             "silu_and_mul_backward": (g, x), "gelu_and_mul_backward": (g, x, "none")}
    assert set(cases) == set(GATED_NAMES)
    for name, args in cases.items():
        assert set(torch.library.opcheck(getattr(T, name).default, args).values()) == {"SUCCESS"}, name
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fx = torch.empty(2, 5, 14, dtype=torch.bfloat16)
        assert T.silu_and_mul(fx).shape == (2, 5, 7) and T.gelu_and_mul_backward(torch.empty(2, 5, 7), fx).shape == fx.shape
    assert torch.equal(O.SiLUAndMul()(x), O.silu_and_mul(x))
    assert torch.equal(O.GELUAndMul("tanh")(x), O.gelu_and_mul(x, "tanh")) and "tanh" in repr(O.GELUAndMul("tanh"))


def test_compile_fullgraph_on_cpu():
    f = torch.compile(lambda x: O.silu_and_mul(x) * 2, fullgraph=True, dynamic=False)
    x = torch.randn(3, 8)
    assert torch.allclose(f(x), _ref(x, "silu") * 2)


def test_errors_name_the_fix():
    with pytest.raises(SpecError, match=r"silu_and_mul: the last dim of x holds \[gate \| up\] and must be even"):
        O.silu_and_mul(torch.randn(3, 7))
    with pytest.raises(SpecError, match="must be even"):
        O.gelu_and_mul(torch.tensor(1.0))
    with pytest.raises(SpecError, match="approximate must be 'none' or 'tanh'"):
        O.gelu_and_mul(torch.randn(2, 4), "fast")
    from opsmith.ops._register import ops
    with pytest.raises(SpecError, match="must be even"):  # the operator itself checks too (not only the wrapper)
        ops().silu_and_mul(torch.randn(3, 7))


def test_gated_kernels_compile_for_every_dtype():
    pytest.importorskip("cuda.bindings.nvrtc")
    from opsmith._build._nvrtc import compile_request, make_request
    from opsmith.ops import _sources
    for job in _sources.jobs("sm_90", files=("gated.cu",)):
        b = compile_request(make_request(**job))
        assert set(b.lowered_names) == set(job["name_expressions"]) and b.code[:4] == b"\x7fELF"
