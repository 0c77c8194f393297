"""The C-shim CUDA kernel of opsmith.custom_op on a GPU: registered in place of the Python
implementation, it matches eager, passes opcheck, launches on the current stream (a CUDA graph
captures it, a side stream orders it) and compiles in a fullgraph."""
from __future__ import annotations

import itertools
import os

import pytest

torch = pytest.importorskip("torch")

import opsmith  # noqa: E402
from conftest import cache_dir  # noqa: E402
from opsmith._torch import _cshim  # noqa: E402

pytestmark = pytest.mark.gpu

SRC = r"""
template <typename T>
__global__ void relu(const T* x, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0);
}
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""
ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
_ids = itertools.count()


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    if not _cshim.available(cuda=True):
        pytest.skip(f"torch {torch.__version__} exports no C shim for CUDA ops")
    with cache_dir(tmp_path_factory.mktemp("cshim-cache")):
        mod = opsmith.CudaModule(SRC, name_expressions=["relu<float>", "relu<double>"])
        ns = f"opsmith_cshim_gpu{os.getpid()}"
        relu = opsmith.custom_op(f"{ns}::relu", kernel=[mod.get_kernel("relu<float>"),
                                                        mod.get_kernel("relu<double>")])
        add = opsmith.custom_op(f"{ns}::add", kernel=mod.get_kernel("add"))
        return relu, add


def test_registered_through_the_shim(ops):
    relu, add = ops
    assert relu.cshim and add.cshim
    assert not relu._fast  # no Python CUDA implementation registered


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_eager(ops, dtype):
    relu, add = ops
    for shape in [(1,), (1000,), (3, 1 << 16), (0, 4)]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        assert torch.equal(relu(x), torch.relu(x))
    xt = torch.randn(64, 33, device="cuda", dtype=dtype).t()
    assert torch.equal(relu(xt), torch.relu(xt))
    a, b = torch.randn(77, device="cuda"), torch.randn(77, device="cuda")
    assert torch.equal(add(a, b), a + b)


def test_errors(ops):
    relu, add = ops
    with pytest.raises(RuntimeError, match="no kernel takes inputs of dtype float16"):
        relu(torch.randn(4, device="cuda", dtype=torch.float16))
    assert torch.equal(relu(torch.ones(3, device="cuda")), torch.ones(3, device="cuda"))


def test_opcheck(ops):
    relu, add = ops
    x = torch.randn(5, 3, device="cuda")
    for op, args in ((relu, (x,)), (add, (x, x + 1))):
        assert torch.library.opcheck(op.default, args, test_utils=ALL_UTILS) == {u: "SUCCESS" for u in ALL_UTILS}


def test_side_stream_and_cuda_graph(ops):
    relu, add = ops
    x = torch.randn(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = add(relu(x), x)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(y, torch.relu(x) + x)
    static_x = torch.randn(4096, device="cuda")
    add(relu(static_x), static_x)  # warm: kernels loaded before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = add(relu(static_x), static_x)
    for _ in range(3):
        static_x.copy_(torch.randn(4096, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, add(relu(static_x), static_x))
        assert torch.equal(static_y, torch.relu(static_x) + static_x)


def test_compile_fullgraph(ops):
    relu, add = ops

    def f(x):
        return add(relu(x), x) * 2

    x = torch.randn(300, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(x), f(x))
    assert torch._dynamo.explain(f)(x).graph_break_count == 0


SCALAR_SRC = r"""
extern "C" __global__ void axpb(const float* x, float a, long long b, bool neg, float* y, long long n) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = (neg ? -a : a) * x[i] + (float)b;
}
extern "C" __global__ void relu_bwd(const float* grad, const float* x, float* dx, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) dx[i] = x[i] > 0.f ? grad[i] : 0.f;
}
"""


def test_scalars_the_elementwise_rule_and_native_autograd_on_the_c_path(ops):
    """float/int/bool arguments, a grid-stride kernel with 16 items a thread, and the native
    Autograd kernel over C-shim kernels: gradients, opcheck, a fullgraph compile."""
    relu, _ = ops
    mod = opsmith.CudaModule(SCALAR_SRC)
    ns = f"opsmith_cshim_gpu{os.getpid()}"
    axpb = opsmith.custom_op(f"{ns}::axpb_{next(_ids)}", kernel=mod.get_kernel("axpb"),
                             launch=opsmith.Elementwise(items_per_thread=16))
    assert axpb.cshim and axpb.schema.text == "(Tensor x, float a, int b, bool neg) -> Tensor"
    x = torch.randn(100_003, device="cuda")
    # atol: the kernel's a * x + b contracts to one fma; near zero that differs from torch's two roundings
    assert torch.allclose(axpb(x, 1.5, 3, False), 1.5 * x + 3, atol=1e-6)
    assert torch.allclose(axpb(x, 1.5, -(2 ** 40), True), -1.5 * x - 2 ** 40)
    bwd = opsmith.custom_op(f"{ns}::relu_bwd_{next(_ids)}", "(Tensor grad, Tensor x) -> Tensor",
                            kernel=mod.get_kernel("relu_bwd"))
    r = opsmith.custom_op(f"{ns}::relu_ag_{next(_ids)}", "(Tensor x) -> Tensor", kernel=relu._kernels)
    r.register_autograd(bwd, save=("x",))
    assert r.cshim and bwd.cshim and r.autograd == "native"
    xg = torch.randn(4097, device="cuda", requires_grad=True)
    (g,) = torch.autograd.grad(r(xg).sum(), xg)
    assert torch.equal(g, (xg > 0).float())
    assert torch.library.opcheck(r.default, (torch.randn(5, 3, device="cuda", requires_grad=True),),
                                 test_utils=ALL_UTILS) == {u: "SUCCESS" for u in ALL_UTILS}
    torch._dynamo.reset()
    f = torch.compile(lambda v: r(v).square().sum(), fullgraph=True)
    f(xg).backward()
    assert torch.allclose(xg.grad, 2 * torch.relu(xg.detach()))
