"""opsmith.custom_op without a GPU: schemas, fake kernels, CPU implementations, opcheck,
torch.compile and torch.export with an extension function, re-registration rules, error texts.

NVRTC compiles without a GPU, so kernel ops are built from real kernels (arch sm_90): their
schemas, bindings and fake kernels are checked here; their launches in test_torch_ops_gpu.py.
"""
from __future__ import annotations

import itertools
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import opsmith  # noqa: E402
from opsmith import OpsmithError, Out, SpecError  # noqa: E402

RELU_SRC = r"""
extern "C" __global__ void relu_f32(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" __global__ void relu_f64(const double* x, double* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.0 ? x[i] : 0.0;
}
extern "C" __global__ void axpy(const float* x, const float* b, float alpha, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = alpha * x[i] + b[i];
}
extern "C" __global__ void minmax(const float* x, float* lo, float* hi, int rows, int cols) {}
"""

EXT_SRC = r"""
torch::Tensor relu(torch::Tensor x) { return x.clamp_min(0); }
torch::Tensor relu_backward(torch::Tensor grad, torch::Tensor x) { return grad * (x > 0).to(grad.scalar_type()); }
std::tuple<torch::Tensor, torch::Tensor> split_sign(torch::Tensor x, double scale) {
  return {x.clamp_min(0) * scale, x.clamp_max(0) * scale};
}
"""

_names = itertools.count()


def fresh(name: str) -> str:
    """A namespace-qualified name not used before in this process (ops live as long as it)."""
    return f"opsmith_test{os.getpid()}::{name}_{next(_names)}"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    pytest.importorskip("cuda.bindings")
    old = os.environ.get("OPSMITH_CACHE_DIR")
    os.environ["OPSMITH_CACHE_DIR"] = str(tmp_path_factory.mktemp("nvrtc-cache"))
    _reset_store()
    try:
        mod = opsmith.CudaModule(RELU_SRC, arch="sm_90")
    finally:
        _restore(old)
    return {n: mod.get_kernel(n) for n in ("relu_f32", "relu_f64", "axpy", "minmax")}


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """The C++ extension, built once for this file in its own cache."""
    old = os.environ.get("OPSMITH_CACHE_DIR")
    os.environ["OPSMITH_CACHE_DIR"] = str(tmp_path_factory.mktemp("ext-cache"))
    _reset_store()
    try:
        return opsmith.load_inline("ops_test_ext", EXT_SRC, functions=["relu", "relu_backward", "split_sign"])
    finally:
        _restore(old)


def _restore(old):
    if old is None:
        os.environ.pop("OPSMITH_CACHE_DIR", None)
    else:
        os.environ["OPSMITH_CACHE_DIR"] = old
    _reset_store()


def _reset_store():
    """Forget the open stores, so that the next one opens at OPSMITH_CACHE_DIR."""
    from opsmith._cache._open import reset
    reset()


ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck_all(op, args):
    result = torch.library.opcheck(op, args, test_utils=ALL_UTILS)
    assert result == {u: "SUCCESS" for u in ALL_UTILS}


# -- schemas -----------------------------------------------------------------------------------
def test_schema_derived_from_kernel_signature(kernels):
    relu = opsmith.custom_op(fresh("relu"), kernel=[kernels["relu_f32"], kernels["relu_f64"]])
    assert relu.schema.text == "(Tensor x) -> Tensor"
    axpy = opsmith.custom_op(fresh("axpy"), kernel=kernels["axpy"])
    assert axpy.schema.text == "(Tensor x, Tensor b, float alpha) -> Tensor"
    assert str(axpy.default._schema).endswith("(Tensor x, Tensor b, float alpha) -> Tensor")
    # the generated CUDA implementation: contiguous inputs, one allocation, the kernel's launcher
    impl = axpy._python_cuda  # registered where the op does not take the C-shim path (a GPU machine: it does)
    assert "b = b.contiguous()" in impl._opsmith_source
    assert "_o0 = _empty_like(x)" in impl._opsmith_source
    assert "_launch(_c, x, b, alpha, _o0, _n)" in impl._opsmith_source


def test_schema_text_python_annotations_and_pybind_doc(ext):
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha
    op = opsmith.custom_op(fresh("scale"), cpu=scale)
    assert op.schema.text == "(Tensor x, float alpha) -> Tensor"
    op2 = opsmith.custom_op(fresh("scale"), "scale(Tensor x, float alpha=2.0) -> Tensor",
                            cpu=lambda x, alpha=2.0: x * alpha)
    assert op2.schema.text == "(Tensor x, float alpha=2.0) -> Tensor"
    assert torch.equal(op2(torch.ones(2)), torch.full((2,), 2.0))
    op3 = opsmith.custom_op(fresh("split"), cpu=ext.split_sign)
    assert op3.schema.text == "(Tensor arg0, float arg1) -> (Tensor, Tensor)"
    pos, neg = op3(torch.tensor([-1.0, 2.0]), 3.0)
    assert pos.tolist() == [0.0, 6.0] and neg.tolist() == [-3.0, 0.0]


def test_kernel_binding_by_name_position_and_args(kernels):
    k = kernels["axpy"]
    # names differ from the kernel's: positions decide (tensors, then outputs, then numbers, then n)
    op = opsmith.custom_op(fresh("axpy"), "(Tensor a, Tensor c, float s) -> Tensor", kernel=k)
    src = op._python_cuda._opsmith_source
    assert "_launch(_c, a, c, s, _o0, _n)" in src
    op2 = opsmith.custom_op(fresh("axpy"), "(Tensor b, Tensor x, float alpha) -> Tensor", kernel=k,
                            args=("x", "b", "alpha", "out", "n"))
    assert "_launch(_c, x, b, alpha, _o0, _n)" in op2._python_cuda._opsmith_source
    with pytest.raises(SpecError, match="args= lists 2"):
        opsmith.custom_op(fresh("axpy"), "(Tensor x, Tensor b, float alpha) -> Tensor", kernel=k, args=("x", "b"))
    with pytest.raises(SpecError, match="would take"):
        opsmith.custom_op(fresh("axpy"), "(Tensor x, Tensor b, float alpha) -> Tensor", kernel=k,
                          args=("x", "alpha", "b", "out", "n"))
    with pytest.raises(SpecError, match="does not receive"):
        opsmith.custom_op(fresh("axpy"), "(Tensor x, Tensor b, Tensor c, float alpha) -> Tensor", kernel=k)


def test_kernel_with_two_outputs_and_a_launch_rule(kernels):
    rule = lambda x, rows, cols, lo, hi: ((rows,), (128,))  # noqa: E731
    row = Out(shape=lambda x, rows, cols: (rows,))
    op = opsmith.custom_op(fresh("minmax"), kernel=kernels["minmax"], launch=rule, out=[row, row])
    assert op.schema.text == "(Tensor x, int rows, int cols) -> (Tensor, Tensor)"
    src = op._python_cuda._opsmith_source
    assert "_c = _config_of(_kern, _cfgs, _RULE(x, rows, cols, _o0, _o1))" in src
    assert "_launch(_c, x, _o0, _o1, rows, cols)" in src
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        lo, hi = op(torch.empty(7, 3, device="cuda"), 7, 3)
    assert lo.shape == hi.shape == (7,) and lo.device.type == "cuda"


# -- fake kernels ------------------------------------------------------------------------------
def test_fake_kernel_from_kernel_signature(kernels):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    op = opsmith.custom_op(fresh("relu"), kernel=[kernels["relu_f32"], kernels["relu_f64"]])
    with FakeTensorMode():
        x = torch.empty(4, 5, device="cuda", dtype=torch.float64).t()  # non-contiguous
        y = op(x)
    assert isinstance(y, FakeTensor) and y.shape == (5, 4) and y.dtype == torch.float64
    assert y.is_contiguous()  # as the real one: inputs are made contiguous first


def test_fake_kernel_shapes_dtypes_and_zeros():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def cpu(x, dim):
        return x.sum(dim), x.argmax(dim)
    op = opsmith.custom_op(fresh("reduce"), "(Tensor x, int dim) -> (Tensor values, Tensor indices)", cpu=cpu,
                           out=[Out(shape=lambda x, dim: x.shape[:dim] + x.shape[dim + 1:], zeros=True),
                                Out(shape=lambda x, dim: x.shape[:dim] + x.shape[dim + 1:], dtype="int64")])
    assert op.schema.return_names == ["values", "indices"]
    with FakeTensorMode():
        v, i = op(torch.empty(3, 4, 5), 1)
    assert v.shape == i.shape == (3, 5) and v.dtype == torch.float32 and i.dtype == torch.int64
    opcheck_all(op.default, (torch.randn(3, 4, 5), 1))
    op2 = opsmith.custom_op(fresh("cast"), "(Tensor x, Tensor like) -> Tensor", cpu=lambda x, like: x.to(like.dtype),
                            out=Out(dtype="like"))
    with FakeTensorMode():
        y = op2(torch.empty(2), torch.empty(1, dtype=torch.float64))
    assert y.dtype == torch.float64 and y.shape == (2,)


def test_register_fake_replaces_the_generated_one():
    from torch._subclasses.fake_tensor import FakeTensorMode
    op = opsmith.custom_op(fresh("half"), "(Tensor x) -> Tensor", cpu=lambda x: x[: x.shape[0] // 2].clone())
    op.register_fake(lambda x: x.new_empty((x.shape[0] // 2,)))
    with FakeTensorMode():
        assert op(torch.empty(6)).shape == (3,)
    opcheck_all(op.default, (torch.randn(6),))


# -- CPU implementations, autograd, opcheck ------------------------------------------------------
def test_python_cpu_op_with_backward_op_passes_opcheck_and_gradcheck():
    relu = opsmith.custom_op(fresh("relu"), "(Tensor x) -> Tensor", cpu=lambda x: x.clamp_min(0))
    bwd = opsmith.custom_op(fresh("relu_bwd"), "(Tensor grad, Tensor x) -> Tensor", cpu=lambda g, x: g * (x > 0))
    relu.register_autograd(bwd, save=("x",))
    x = torch.randn(8, requires_grad=True)
    opcheck_all(relu.default, (x,))
    relu(x).sum().backward()
    assert torch.equal(x.grad, (x > 0).float())
    assert torch.autograd.gradcheck(relu, (torch.randn(6, dtype=torch.float64, requires_grad=True),))


def test_torch_style_autograd_with_scalars_and_kwarg_only():
    op = opsmith.custom_op(fresh("axpb"), "(Tensor x, Tensor b, *, float alpha=2.0) -> Tensor",
                           cpu=lambda x, b, *, alpha=2.0: alpha * x + b)

    def setup(ctx, inputs, output):
        ctx.alpha = inputs[2]

    op.register_autograd(lambda ctx, g: (g * ctx.alpha, g, None), setup_context=setup)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: op(x, b, alpha=3.0), (x, b))
    opcheck_all(op.default, (x, b))


def test_no_grad_calls_skip_the_redispatch():
    seen = []

    def cpu(x):
        f = sys._getframe(1)
        seen.append((f.f_code.co_filename, f.f_lineno))
        return x.clamp_min(0)
    op = opsmith.custom_op(fresh("relu"), "(Tensor x) -> Tensor", cpu=cpu)
    op.register_autograd(lambda g, x: g * (x > 0), save=("x",))
    op(torch.randn(3))
    with torch.no_grad():
        op(torch.randn(3, requires_grad=True))
    # both straight from the generated Autograd kernel's shortcut line, not through redispatch
    assert [s[0] for s in seen] == [f"<opsmith op {op.name} autograd>"] * 2
    assert len({s[1] for s in seen}) == 1
    fast_line = seen[0][1]
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():  # a fake call goes below autograd to the fake kernel
        assert op(torch.empty(4)).shape == (4,)
    assert len(seen) == 2
    assert fast_line == 6


def test_extension_function_op_opcheck_compile_export(ext):
    relu = opsmith.custom_op(fresh("ext_relu"), cpu=ext.relu)
    bwd = opsmith.custom_op(fresh("ext_relu_bwd"), cpu=ext.relu_backward)
    relu.register_autograd(bwd, save=("arg0",))
    assert relu.schema.text == "(Tensor arg0) -> Tensor"
    x = torch.randn(16, requires_grad=True)
    opcheck_all(relu.default, (x,))
    opcheck_all(bwd.default, (torch.randn(16), torch.randn(16)))
    assert torch.autograd.gradcheck(relu, (torch.randn(6, dtype=torch.float64, requires_grad=True),))

    split = opsmith.custom_op(fresh("ext_split"), cpu=ext.split_sign)

    def model(x):
        pos, neg = split(relu(x) - 0.5, 2.0)
        return pos + neg * 3

    x = torch.randn(32)
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops_in_graph = {str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any(relu.name.split("::")[1] in t for t in ops_in_graph), ops_in_graph
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), model(x))

    class M(torch.nn.Module):
        def forward(self, x):
            return model(x)
    ep = torch.export.export(M(), (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(split.name.split("::")[1] in t for t in targets), targets
    assert torch.allclose(ep.module()(x), model(x))


def test_compile_fullgraph_inductor_with_extension_op(ext):
    relu = opsmith.custom_op(fresh("ext_relu"), cpu=ext.relu)
    counter = torch._dynamo.testing.CompileCounter()
    model = lambda x: relu(x * 2) + 1  # noqa: E731
    x = torch.randn(10)
    assert torch.equal(torch.compile(model, fullgraph=True, backend=counter)(x), model(x))
    assert counter.frame_count == 1 and counter.op_count >= 3


# -- registration rules ------------------------------------------------------------------------
def test_same_definition_again_is_a_no_op():
    name = fresh("twice")

    def make():
        op = opsmith.custom_op(name, "(Tensor x) -> Tensor", cpu=lambda x: x * 2)
        op.register_autograd(lambda g: g * 2, save=())
        op.register_fake(lambda x: torch.empty_like(x))
        return op
    a = make()
    b = make()  # a re-run cell: new function objects, same code
    assert a is b
    assert torch.equal(b(torch.ones(2)), torch.full((2,), 2.0))


def test_different_definition_under_a_taken_name_raises():
    name = fresh("op")
    op = opsmith.custom_op(name, "(Tensor x) -> Tensor", cpu=lambda x: x * 2)
    with pytest.raises(OpsmithError, match=r"already registered .* schema differs.*another name.*_v2"):
        opsmith.custom_op(name, "(Tensor x, float a) -> Tensor", cpu=lambda x, a: x * a)
    with pytest.raises(OpsmithError, match=r"implementation differs.*restart Python"):
        opsmith.custom_op(name, "(Tensor x) -> Tensor", cpu=lambda x: x * 3)
    op.register_autograd(lambda g: g * 2, save=())
    with pytest.raises(OpsmithError, match="already has a different autograd formula"):
        op.register_autograd(lambda g: g * 3, save=())


def test_name_taken_outside_opsmith_raises():
    ns, opname = fresh("outside").split("::")
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define(f"{opname}(Tensor x) -> Tensor")
    with pytest.raises(OpsmithError, match="already defined outside opsmith.*another name"):
        opsmith.custom_op(f"{ns}::{opname}", "(Tensor x) -> Tensor", cpu=lambda x: x)
    lib._destroy()


# -- error texts -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, pattern", [
    (dict(name="relu"), "must be 'namespace::name'"),
    (dict(name="aten::myrelu"), "torch's own"),
    (dict(schema="(Tensor x -> Tensor"), "does not parse"),
    (dict(schema="(Tensor(a!) x) -> Tensor"), "functional"),
    (dict(schema="(Tensor x) -> int"), "return tensors"),
    (dict(schema=None, cpu=lambda x: x), "no schema given"),
    (dict(out=[Out(), Out()]), r"returns 1 tensor\(s\) but out= gives 2"),
    (dict(out=Out(like="y")), "no argument of that name"),
    (dict(out=Out(like=1), schema="(Tensor x, int k) -> Tensor"), "is a int, not a Tensor"),
    (dict(out="like x"), "takes opsmith.Out"),
    (dict(kernel=len), "takes opsmith kernels"),
    (dict(launch=lambda x, o: ((1,), (1,))), "need kernel="),
])
def test_error_texts(kwargs, pattern):
    kwargs = {"name": fresh("bad"), "schema": "(Tensor x) -> Tensor", "cpu": lambda x: x, **kwargs}
    with pytest.raises(SpecError, match=pattern):
        opsmith.custom_op(kwargs.pop("name"), kwargs.pop("schema"), **kwargs)


def test_kernel_errors(kernels):
    with pytest.raises(SpecError, match="kernel= or cuda="):
        opsmith.custom_op(fresh("x"), kernel=kernels["relu_f32"], cuda=lambda x: x)
    with pytest.raises(SpecError, match="is a str, which a kernel cannot take"):
        opsmith.custom_op(fresh("x"), "(Tensor x, str mode, float alpha) -> Tensor", kernel=kernels["axpy"],
                          args=("x", "x", "mode", "out", "n"))


def test_register_kernel_checks():
    op = opsmith.custom_op(fresh("x"), "(Tensor x) -> Tensor", cpu=lambda x: x.clone())
    with pytest.raises(SpecError, match="'cpu' or 'cuda'"):
        op.register_kernel("tpu", lambda x: x)
    with pytest.raises(OpsmithError, match="already has a different CPU"):
        op.register_cpu(lambda x: x + 0)


def test_import_opsmith_stays_cheap():
    import subprocess
    code = ("import sys, opsmith; assert 'torch' not in sys.modules; opsmith.Out; "
            "assert 'torch' not in sys.modules, 'Out imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_optional_tensor_without_a_default_stays_a_required_argument():
    """`Tensor? w, Tensor x`: the generated functions must not give w a default (a SyntaxError
    in the generated code, since x after it has none)."""
    op = opsmith.custom_op(fresh("opt"), "opt(Tensor? w, Tensor x) -> Tensor", out=opsmith.Out(like="x"),
                           cpu=lambda w, x: x if w is None else x * w)
    x = torch.arange(3.0)
    assert torch.equal(op(None, x), x) and torch.equal(op(torch.full((3,), 2.0), x), 2 * x)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert op.default(None, torch.empty(4)).shape == (4,)
