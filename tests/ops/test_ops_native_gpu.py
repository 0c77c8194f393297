"""opsmith.ops' C++ CUDA implementations on a GPU: registered in place of the Python ones, equal
to them bit for bit (the same kernels and plans) in every op, dtype and row strategy, forward
and backward; their errors say what to do; they launch on the current stream (a side stream,
a CUDA graph). test_ops_gpu.py checks the numbers against torch through the same operators."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from opsmith import ops  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _norms as nf  # noqa: E402
from opsmith.ops import _register  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# warp, block, long cached, long uncached (fp32 backward: 2 x 70001 x 4 bytes), empty; the norms' l2 forwards
# (16 KiB rows and more, whole vectors: 20000, 8200)
ROWS = [(5, 7), (64, 64), (16, 1000), (3, 3001), (2, 20000), (2, 70001), (0, 64), (3, 8200),
        (4, 2048), (2, 6000),  # the norms' forwards of 4 chunks a thread (c4)
        (3, 12288), (2, 9001),  # softmax_fwd_wide3 (bf16, whole vectors and not; float 6000 too)
        (3, 3072), (2, 6144), (2, 24576),  # softmax's rows of whole warps (_launch._whole_warps)
        (1100, 1536), (1300, 3072), (2, 5120),  # the norms' rows of whole warps (norm_c4_plan, norm_bwd_plan)
        (2001, 5120), (1000, 2560),  # the norm backwards at two blocks an SM (norm_bwd_sm_plan)
        (2, 32768)]  # float softmax's backward staging grad_y in shared memory (softmax_bwd_wide_sm)


@pytest.fixture(scope="module")
def T():
    t = _register.ops()
    dump = torch._C._dispatch_dump("opsmith::layer_norm")
    if "osm_ops.cpp" not in dump:
        pytest.fail(f"the native CUDA kernels are not registered on this GPU machine:\n{dump}")
    return t


def _rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, device="cuda", generator=g).to(dtype)


def _same(a, b, what):
    a, b = (a,) if isinstance(a, torch.Tensor) else a, (b,) if isinstance(b, torch.Tensor) else b
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, (what, x.dtype, y.dtype, x.shape, y.shape)
        assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)), what


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_elementwise_equal_to_the_python_implementation(T, dtype):
    for n in (0, 1, 7, 4099, (1 << 20) + 3, (1 << 24) + 5):  # the last: the erf GELU's unrolled plan
        x, g = _rand(n, dtype, 1), _rand(n, dtype, 2)
        for name, kernel in (("relu", "relu"), ("silu", "silu")):
            _same(getattr(T, name)(x), fn.ew_fwd(kernel, x), (name, n))
            _same(getattr(T, name + "_backward")(g, x), fn.ew_bwd(kernel, g, x), (name, n))
        for approx, kernel in (("none", "gelu_erf"), ("tanh", "gelu_tanh")):
            _same(T.gelu(x, approx), fn.ew_fwd(kernel, x), ("gelu", approx, n))
            _same(T.gelu_backward(g, x, approx), fn.ew_bwd(kernel, g, x), ("gelu_backward", approx, n))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_row_ops_equal_to_the_python_implementation(T, dtype):
    for rows, cols in ROWS:
        x, g = _rand((rows, cols), dtype, 3), _rand((rows, cols), dtype, 4)
        w, b = _rand(cols, dtype, 5), _rand(cols, dtype, 6)
        y = T.softmax(x, -1)
        _same(y, fn.softmax_cuda(x, -1), ("softmax", rows, cols))
        _same(T.softmax_backward(g, y, -1), fn.softmax_backward_cuda(g, y, -1), ("softmax_backward", rows, cols))
        for weight, bias in ((None, None), (w, b), (w, None)):
            out = T.layer_norm(x, [cols], weight, bias, 1e-5)
            _same(out, nf.layer_norm_fwd(x, [cols], weight, bias, 1e-5), ("layer_norm", rows, cols))
            want = (weight is not None, bias is not None)
            _same(T.layer_norm_backward(g, x, [cols], out[1], out[2], *want, weight),
                  nf.layer_norm_bwd(g, x, [cols], out[1], out[2], *want, weight), ("layer_norm_backward", rows, cols))
            for eps in (None, 1e-6):
                out = T.rms_norm(x, [cols], weight, eps)
                _same(out, nf.rms_norm_fwd(x, [cols], weight, eps), ("rms_norm", rows, cols, eps))
                _same(T.rms_norm_backward(g, x, [cols], out[1], weight is not None, weight),
                      nf.rms_norm_bwd(g, x, [cols], out[1], weight is not None, weight), ("rms_norm_bwd", rows, cols))


def test_views_other_dims_and_multi_dim_shapes(T):
    x = _rand((6, 33, 40), torch.float32, 7)
    for dim in (0, 1, -1, -3):
        _same(T.softmax(x, dim), fn.softmax_cuda(x, dim), ("softmax", dim))
    xt = x.transpose(1, 2)  # not contiguous
    _same(T.layer_norm(xt, [33], None, None, 1e-5)[0],
          nf.layer_norm_fwd(xt, [33], None, None, 1e-5)[0], "layer_norm view")
    _same(T.rms_norm(x, [33, 40], None, None), nf.rms_norm_fwd(x, [33, 40], None, None), "rms_norm 2-d")
    _same(T.relu(xt), torch.relu(xt), "relu view")
    w = _rand(40, torch.float32, 8)  # the public functions: the composite first-output ops
    _same(ops.layer_norm(x, 40, w), T.layer_norm(x, [40], w, None, 1e-5)[0], "layer_norm_y")
    _same(ops.rms_norm(x, (33, 40)), T.rms_norm(x, [33, 40], None, None)[0], "rms_norm_y")
    assert T.relu(torch.empty(0, 3, device="cuda")).shape == (0, 3)


def test_errors_name_the_problem_and_the_fix(T):
    """Bad arguments are ValueErrors (as the Python path's SpecError, a ValueError) that say what to do."""
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(ValueError, match=r"opsmith.ops.relu: CUDA tensors of dtype torch.int32 are not supported"):
        T.relu(torch.ones(3, device="cuda", dtype=torch.int32))
    with pytest.raises(ValueError, match=r"approximate must be 'none' or 'tanh', got 'fast'"):
        T.gelu(x, "fast")
    with pytest.raises(ValueError, match=r"dim 2 is out of range for a 2-d tensor"):
        T.softmax(x, 2)
    with pytest.raises(ValueError, match=r"normalized_shape \[4\] must be the last dims"):
        T.layer_norm(x, [4], None, None, 1e-5)
    with pytest.raises(ValueError, match=r"weight has dtype torch.float16 and x torch.float32; convert it"):
        T.rms_norm(x, [8], torch.ones(8, device="cuda", dtype=torch.float16), None)
    with pytest.raises(ValueError, match=r"bias has 4 elements; normalized_shape has 8"):
        T.layer_norm(x, [8], None, torch.ones(4, device="cuda"), 1e-5)
    with pytest.raises(ValueError, match=r"grad has shape \[3\] and x \[4, 8\]"):
        T.relu_backward(torch.ones(3, device="cuda"), x)
    with pytest.raises(ValueError, match=r"rstd must hold 4 values of torch.float32"):
        T.rms_norm_backward(x, x, [8], torch.ones(3, device="cuda"), False, None)
    assert torch.equal(T.relu(x), torch.relu(x))  # still fine after the errors


def test_current_stream_and_cuda_graph(T):
    x = torch.randn(4096, 512, device="cuda")
    w = torch.randn(512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = ops.rms_norm(ops.silu(x), 512, w)
    torch.cuda.current_stream().wait_stream(s)
    _same(y, T.rms_norm(T.silu(x), [512], w, None)[0], "side stream")
    static_x = torch.randn(256, 512, device="cuda")
    f = lambda v: ops.softmax(ops.layer_norm(ops.gelu(v), 512, w), -1)
    f(static_x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = f(static_x)
    for _ in range(3):
        static_x.copy_(torch.randn(256, 512, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        _same(static_y, f(static_x), "graph replay")


def test_training_step_through_native_autograd_and_kernels(T):
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    w = torch.randn(1024, device="cuda", requires_grad=True)
    b = torch.randn(1024, device="cuda", requires_grad=True)
    loss = ops.softmax(ops.layer_norm(ops.silu(x), 1024, w, b), -1).square().sum()
    loss.backward()
    ref = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    F = torch.nn.functional
    F.softmax(F.layer_norm(F.silu(ref[0]), (1024,), ref[1], ref[2]), -1).square().sum().backward()
    for got, want in zip((x, w, b), ref):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)
