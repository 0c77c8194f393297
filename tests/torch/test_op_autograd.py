"""The Autograd kernels of opsmith ops, on CPU: the native C++ kernel and the Python one.

Both kernels are checked for the same behaviour (parametrised ``path``): gradients
(``gradcheck`` in float64), ``needs_grad(...)`` and ``grads_for=``, optional tensors that are
None or need no gradient, outputs of integer dtype, ``not_differentiable``, ``opcheck`` with
its four utils, ``torch.compile(fullgraph=True)`` forward and backward, and the error texts.
The native library is a real torch C++ build (through the torch-extension profile).
"""
from __future__ import annotations

import itertools
import os

import pytest

torch = pytest.importorskip("torch")

import opsmith  # noqa: E402
from opsmith import SpecError  # noqa: E402
from opsmith._torch import _autograd_native  # noqa: E402

_names = itertools.count()


def fresh(name: str) -> str:
    return f"opsmith_agtest{os.getpid()}::{name}_{next(_names)}"


@pytest.fixture(params=["native", "python"])
def path(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setenv("OPSMITH_TORCH_OP_NATIVE_AUTOGRAD", "0")
        from opsmith._config import reset
        reset()
    return request.param


def _relu_pair():
    relu = opsmith.custom_op(fresh("relu"), "(Tensor x) -> Tensor", cpu=lambda x: x.clamp_min(0))
    back = opsmith.custom_op(fresh("relu_bwd"), "(Tensor g, Tensor x) -> Tensor", cpu=lambda g, x: g * (x > 0))
    return relu, back


def _rms_backward(g, x, rstd, want_w, w):
    xh = x * rstd[:, None]
    gw = g * w if w is not None else g
    dx = rstd[:, None] * (gw - xh * (gw * xh).mean(-1, keepdim=True))
    dw = (g * xh).sum(0) if want_w else x.new_empty(0)
    return dx, dw


def _rms_pair():
    """A two-output op with an int[] argument and an optional weight, as opsmith.ops.rms_norm."""
    def fwd(x, shape, w, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
        y = x * rstd[:, None]
        return (y * w if w is not None else y), rstd

    rms = opsmith.custom_op(fresh("rms"), "(Tensor x, int[] shape, Tensor? weight, float eps) -> (Tensor y, Tensor rstd)",
                            cpu=fwd)
    rms.register_fake(lambda x, shape, w, eps: (torch.empty_like(x), x.new_empty(x.shape[0])))
    back = opsmith.custom_op(fresh("rms_bwd"), "(Tensor g, Tensor x, Tensor rstd, bool want_w, Tensor? w) "
                             "-> (Tensor, Tensor)", cpu=_rms_backward)
    back.register_fake(lambda g, x, r, want_w, w: (torch.empty_like(x), x.new_empty(x.shape[1:] if want_w else (0,))))
    rms.register_autograd(back, args=("grad0", "x", "rstd", "needs_grad(weight)", "weight"),
                          grads_for=("x", "weight"))
    return rms, back


def test_an_op_whose_backward_is_an_op_gets_the_path_asked_for(path):
    relu, back = _relu_pair()
    back.not_differentiable("no second derivative here")
    relu.register_autograd(back, save=("x",))
    assert relu.autograd == path and back.autograd == path
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    y = relu(x)
    assert (type(y.grad_fn).__name__ == "CppFunction") == (path == "native")
    y.sum().backward()
    assert torch.equal(x.grad, (x > 0).double())
    assert torch.autograd.gradcheck(relu, (torch.randn(6, dtype=torch.float64, requires_grad=True),))
    # no gradient needed: no graph is recorded, under no_grad or for inputs that need none
    assert relu(x.detach()).grad_fn is None
    with torch.no_grad():
        assert relu(x).grad_fn is None
    # a second derivative through the refused backward raises its message
    (g,) = torch.autograd.grad(relu(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative here"):
        g.sum().backward()


def test_args_needs_grad_and_grads_for_give_the_gradients_of_the_named_inputs(path):
    rms, _ = _rms_pair()
    assert rms.autograd == path
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms(x, [4], w, 1e-6)[0], (x, w))
    assert torch.autograd.gradcheck(lambda x: rms(x, [4], None, 1e-6)[0], (x,))  # weight None
    assert torch.autograd.gradcheck(lambda x: rms(x, [4], w.detach(), 1e-6)[0], (x,))  # weight needs none
    # only the weight needs a gradient: x gets none, the weight the same as in a full backward
    y, _ = rms(x.detach(), [4], w, 1e-6)
    y.sum().backward()
    w_only = w.grad.clone()
    w.grad = None
    y, r = rms(x, [4], w, 1e-6)
    (y.sum() + 0 * r.sum()).backward()  # the rstd output used too: its gradient is zeros, not an error
    assert torch.allclose(w.grad, w_only) and x.grad is not None


def test_opcheck_and_compile_pass_through_either_kernel(path):
    rms, _ = _rms_pair()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    result = torch.library.opcheck(rms.default, (x, [4], w, 1e-6))
    assert set(result.values()) == {"SUCCESS"}, result
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: rms(x, [4], w, 1e-6)[0].square().sum(), fullgraph=True, backend="aot_eager")
    f(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    rms(x, [4], w, 1e-6)[0].square().sum().backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, w.grad)


def test_an_integer_output_gets_no_gradient_and_the_float_one_does(path):
    def fwd(x):
        return x * 2, (x > 0).to(torch.int64)

    op = opsmith.custom_op(fresh("split"), "(Tensor x) -> (Tensor, Tensor)", cpu=fwd)
    back = opsmith.custom_op(fresh("split_bwd"), "(Tensor g) -> Tensor", cpu=lambda g: g * 2)
    op.register_autograd(back, args=("grad0",))
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y, sign = op(x)
    assert y.requires_grad and not sign.requires_grad
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2))


def test_an_output_whose_gradient_the_backward_does_not_take_is_not_differentiable(path):
    """As torch's native_layer_norm (mean, rstd): a loss on such an output raises instead of
    dropping its gradient silently; the op's other outputs train as before."""
    def fwd(x):
        return x * 2, x.sum(-1)

    op = opsmith.custom_op(fresh("stat"), "(Tensor x) -> (Tensor, Tensor)", cpu=fwd)
    back = opsmith.custom_op(fresh("stat_bwd"), "(Tensor g) -> Tensor", cpu=lambda g: g * 2)
    op.register_autograd(back, args=("grad0",))
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y, total = op(x)
    assert y.requires_grad and not total.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        total.sum().backward()
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2))


def test_a_backward_function_keeps_the_python_kernel_and_returns_the_same_gradients():
    relu, _ = _relu_pair()
    relu.register_autograd(lambda g, x: g * (x > 0), save=("x",))
    assert relu.autograd == "python"
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(relu, (x,))


def test_registering_the_same_autograd_again_is_a_no_op_and_another_is_refused():
    relu, back = _relu_pair()
    relu.register_autograd(back, save=("x",))
    relu.register_autograd(back, save=("x",))  # a re-run cell
    with pytest.raises(opsmith.OpsmithError, match="already has a different autograd formula"):
        relu.register_autograd(back, args=("grad", "x"))


def test_a_backward_op_that_returns_more_gradients_than_inputs_is_refused_at_registration(path):
    relu, _ = _relu_pair()
    back = opsmith.custom_op(fresh("two"), "(Tensor g, Tensor x) -> (Tensor, Tensor)",
                             cpu=lambda g, x: (g.clone(), g.clone()))
    with pytest.raises(SpecError, match=r"returns 2 gradients for 1 inputs; return one Tensor per input \(x\)"):
        relu.register_autograd(back, save=("x",))


def test_a_backward_function_that_returns_too_many_gradients_is_named():
    relu, _ = _relu_pair()
    relu.register_autograd(lambda g, x: (g, g), save=("x",))
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(opsmith.OpsmithError, match="returned 2 gradients for 1 inputs"):
        relu(x).sum().backward()


@pytest.mark.parametrize("kwargs, message", [
    ({"save": ("y_",)}, "names 'y_', which is neither an argument"),
    ({"args": ("grad3", "x")}, "names 'grad3'"),
    ({"args": ("grad", "needs_grad(z)")}, "names 'needs_grad\\(z\\)'"),
    ({"save": ("x",), "grads_for": ("w",)}, "grads_for=...\\) names 'w', which is not an argument"),
    ({"save": ("x",), "args": ("grad", "x")}, "save= or args=, not both"),
])
def test_bad_names_in_the_short_form_are_refused_with_what_exists(kwargs, message):
    relu, back = _relu_pair()
    with pytest.raises(SpecError, match=message):
        relu.register_autograd(back, **kwargs)


def test_setup_context_with_the_short_form_is_refused():
    relu, back = _relu_pair()
    with pytest.raises(SpecError, match="setup_context= or the short form"):
        relu.register_autograd(back, lambda ctx, i, o: None, save=("x",))


def test_a_library_that_cannot_be_built_leaves_the_python_kernel_with_a_warning(monkeypatch, caplog):
    def fail():
        raise opsmith.OpsmithError("no C++ compiler found")

    monkeypatch.setattr(_autograd_native, "_state", {})
    monkeypatch.setattr(_autograd_native, "build", fail)
    relu, back = _relu_pair()
    with caplog.at_level("WARNING"):
        relu.register_autograd(back, save=("x",))
    assert relu.autograd == "python"
    assert "native Autograd kernels unavailable (no C++ compiler found)" in caplog.text
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(relu, (x,))
