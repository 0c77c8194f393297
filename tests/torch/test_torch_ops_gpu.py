"""opsmith.custom_op on a GPU: an NVRTC ReLU op (float32 and float64 kernels) with its backward
op passes opcheck, gradcheck, fullgraph compile, CUDA-graph capture and export; an extension
function does too on CUDA tensors."""
from __future__ import annotations

import itertools
import os

import pytest

torch = pytest.importorskip("torch")

import opsmith  # noqa: E402

pytestmark = pytest.mark.gpu

SRC = r"""
template <typename T>
__global__ void relu_fwd(const T* x, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0);
}
template <typename T>
__global__ void relu_bwd(const T* grad, const T* x, T* dx, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) dx[i] = x[i] > T(0) ? grad[i] : T(0);
}
template <typename T>
__global__ void scale_add(const T* x, T alpha, T beta, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = alpha * x[i] + beta;
}
"""
EXT_SRC = r"""
torch::Tensor ext_relu(torch::Tensor x) { return x.clamp_min(0); }
torch::Tensor ext_relu_backward(torch::Tensor grad, torch::Tensor x) { return grad * (x > 0).to(grad.scalar_type()); }
"""
ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
_ids = itertools.count()


def _ns() -> str:
    return f"opsmith_gpu{os.getpid()}_{next(_ids)}"


def make_ops():
    """relu (with autograd through relu_bwd) and scale_add, each with float32 and float64 kernels."""
    exprs = [f"{k}<{t}>" for k in ("relu_fwd", "relu_bwd", "scale_add") for t in ("float", "double")]
    mod = opsmith.CudaModule(SRC, name_expressions=exprs)
    k = lambda name: [mod.get_kernel(f"{name}<{t}>") for t in ("float", "double")]  # noqa: E731
    ns = _ns()
    relu = opsmith.custom_op(f"{ns}::relu", kernel=k("relu_fwd"), cpu=lambda x: x.clamp_min(0))
    relu_bwd = opsmith.custom_op(f"{ns}::relu_bwd", kernel=k("relu_bwd"), cpu=lambda g, x: g * (x > 0))
    relu.register_autograd(relu_bwd, save=("x",))
    scale = opsmith.custom_op(f"{ns}::scale_add", kernel=k("scale_add"),
                              cpu=lambda x, alpha, beta: alpha * x + beta)
    scale.register_autograd(lambda ctx, g: (g * ctx.alpha, None, None),
                            setup_context=lambda ctx, inputs, output: setattr(ctx, "alpha", inputs[1]))
    return relu, relu_bwd, scale


@pytest.fixture(scope="module")
def ops():
    return make_ops()


def test_schema_from_the_kernel_signature(ops):
    relu, relu_bwd, scale = ops
    assert relu.schema.text == "(Tensor x) -> Tensor"
    assert relu_bwd.schema.text == "(Tensor grad, Tensor x) -> Tensor"
    assert scale.schema.text == "(Tensor x, float alpha, float beta) -> Tensor"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_backward_match_torch(ops, dtype):
    relu, relu_bwd, scale = ops
    x = torch.randn(1000, 37, device="cuda", dtype=dtype)
    assert torch.equal(relu(x), torch.relu(x))
    assert torch.equal(relu(x.t()), torch.relu(x.t()))  # non-contiguous input
    g = torch.randn_like(x)
    assert torch.equal(relu_bwd(g, x), g * (x > 0))
    assert torch.allclose(scale(x, 2.0, 0.5), 2.0 * x + 0.5)
    assert relu(torch.empty(0, device="cuda", dtype=dtype)).shape == (0,)


def test_opcheck_all_utils(ops):
    relu, relu_bwd, scale = ops
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(64, device="cuda", dtype=dtype, requires_grad=True)
        for op, args in [(relu, (x,)), (relu_bwd, (torch.randn_like(x), x.detach())), (scale, (x, 3.0, -1.0))]:
            result = torch.library.opcheck(op.default, args, test_utils=ALL_UTILS)
            assert result == {u: "SUCCESS" for u in ALL_UTILS}, (op, dtype, result)


def test_gradcheck_float64(ops):
    relu, _, scale = ops
    x = torch.randn(50, device="cuda", dtype=torch.float64)
    x = (x + 0.1 * x.sign()).requires_grad_()  # away from the kink at 0
    assert torch.autograd.gradcheck(relu, (x,))
    assert torch.autograd.gradcheck(lambda x: scale(relu(x), 1.5, 2.0), (x,))


def _model(ops):
    relu, _, scale = ops
    return lambda x: scale(relu(x), 2.0, 1.0) * 3


def test_compile_fullgraph_two_ops_equals_eager(ops):
    model = _model(ops)
    x = torch.randn(4096, device="cuda")
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0
    compiled = torch.compile(model, fullgraph=True)
    assert torch.equal(compiled(x), model(x))
    xg = x.clone().requires_grad_()
    compiled(xg).sum().backward()
    xe = x.clone().requires_grad_()
    model(xe).sum().backward()
    assert torch.equal(xg.grad, xe.grad)


def test_cuda_graph_replay_is_bitwise_eager(ops):
    model = _model(ops)
    static_x = torch.randn(1 << 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream (loads the kernels, fills the config caches)
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = model(static_x)
    new_x = torch.randn_like(static_x)
    static_x.copy_(new_x)
    static_y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    # the graph is not empty: the replay recomputed the output from the new input
    assert torch.equal(static_y, model(new_x))


def test_export(ops):
    model = _model(ops)

    class M(torch.nn.Module):
        def forward(self, x):
            return model(x)

    x = torch.randn(128, device="cuda")
    ep = torch.export.export(M(), (x,))
    names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("relu" in n for n in names) and any("scale_add" in n for n in names), names
    assert torch.equal(ep.module()(x), model(x))


def test_extension_function_on_cuda():
    m = opsmith.load_inline("ops_gpu_ext", EXT_SRC, functions=["ext_relu", "ext_relu_backward"])
    ns = _ns()
    relu = opsmith.custom_op(f"{ns}::relu", cuda=m.ext_relu, cpu=m.ext_relu)
    bwd = opsmith.custom_op(f"{ns}::relu_bwd", cuda=m.ext_relu_backward, cpu=m.ext_relu_backward)
    relu.register_autograd(bwd, save=("arg0",))
    x = torch.randn(256, device="cuda", requires_grad=True)
    for op, args in [(relu, (x,)), (bwd, (torch.randn(256, device="cuda"), x.detach()))]:
        assert torch.library.opcheck(op.default, args, test_utils=ALL_UTILS) == {u: "SUCCESS" for u in ALL_UTILS}
    x64 = torch.randn(20, device="cuda", dtype=torch.float64)
    assert torch.autograd.gradcheck(relu, ((x64 + 0.1 * x64.sign()).requires_grad_(),))
    model = lambda x: relu(x) * 2  # noqa: E731
    assert torch.equal(torch.compile(model, fullgraph=True)(x.detach()), model(x.detach()))
