"""The gated activations on CPU: silu_and_mul / gelu_and_mul (packed [gate | up]) and silu_mul /
gelu_mul (gate and up as two tensors, views included): values and gradients against torch's own
functions, gradcheck, opcheck of the eight operators, fake kernels, compile, the nn.Modules,
errors; the CUDA kernels compiled by NVRTC for every dtype, and the CUDA implementations run with
each launch checked against its kernel's signature and then carried out on the CPU as the
kernel would (pointers, row strides): what reaches the kernel is right, no GPU needed."""
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
    a, b = x[:, :6], x[:, 6:]  # two non-contiguous halves
    cases = {"silu_and_mul": (x.clone().requires_grad_(),), "gelu_and_mul": (x.clone().requires_grad_(), "tanh"),
             "silu_and_mul_backward": (g, x), "gelu_and_mul_backward": (g, x, "none"),
             "silu_mul": (a.clone().requires_grad_(), b), "gelu_mul": (a, b.clone().requires_grad_(), "tanh"),
             "silu_mul_backward": (g, a, b), "gelu_mul_backward": (g, a.contiguous(), b, "none")}
    assert set(cases) == set(GATED_NAMES)
    for name, args in cases.items():
        assert set(torch.library.opcheck(getattr(T, name).default, args).values()) == {"SUCCESS"}, name
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fx = torch.empty(2, 5, 14, dtype=torch.bfloat16)
        assert T.silu_and_mul(fx).shape == (2, 5, 7) and T.gelu_and_mul_backward(torch.empty(2, 5, 7), fx).shape == fx.shape
        assert T.silu_mul(fx[..., :7], fx[..., 7:]).shape == (2, 5, 7)
        dg, du = T.gelu_mul_backward(torch.empty(2, 5, 7), fx[..., :7], fx[..., 7:], "tanh")
        assert dg.shape == du.shape == (2, 5, 7) and dg.is_contiguous()
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


# -- silu_mul / gelu_mul: gate and up as two tensors ---------------------------------------------------------------
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1.6e-2)}  # (atol, rtol) against a float64 reference
PAIRS = {"silu": lambda a, b: O.silu_mul(a, b), "gelu": lambda a, b: O.gelu_mul(a, b),
         "gelu_tanh": lambda a, b: O.gelu_mul(a, b, "tanh")}


def _act(kind):
    if kind == "silu":
        return F.silu
    return lambda t: F.gelu(t, approximate="tanh" if kind == "gelu_tanh" else "none")


def _layouts(d, dtype):
    """(name, gate, up): two tensors, the halves of a packed tensor (2-d, and 3-d at an odd
    offset), a transposed gate (its rows not evenly spaced: copied), an expanded up (row stride
    0), 0-d tensors, empty ones."""
    packed = torch.randn(5, 2 * d, dtype=dtype)
    big = torch.randn(2, 3, 2 * d + 3, dtype=dtype)[..., 1:]
    return [("two", torch.randn(5, d, dtype=dtype), torch.randn(5, d, dtype=dtype)),
            ("halves", packed[:, :d], packed[:, d:]),
            ("3-d halves", big[..., :d], big[..., d:2 * d]),
            ("transposed", torch.randn(d, 5, dtype=dtype).t(), torch.randn(5, d, dtype=dtype)),
            ("expanded", torch.randn(5, d, dtype=dtype), torch.randn(d, dtype=dtype).expand(5, d)),
            ("0-d", torch.tensor(0.7, dtype=dtype), torch.tensor(-1.3, dtype=dtype)),
            ("empty", torch.randn(0, d, dtype=dtype), torch.randn(0, d, dtype=dtype))]


def _reference(kind, a, b, g):
    """act(a) * b and its gradients for a and b, in float64."""
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    want = _act(kind)(a64) * b64
    da, db = torch.autograd.grad(want, (a64, b64), g.double()) if want.numel() else (a64, b64)
    return want.detach(), da, db


@pytest.mark.parametrize("kind", sorted(PAIRS))
@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
def test_pair_values_and_gradients_match_torch_for_every_layout(kind, dtype):
    atol, rtol = TOL[dtype]
    for name, a, b in _layouts(6, dtype):
        a, b = a.clone().requires_grad_() if a.is_contiguous() else a.requires_grad_(), b.requires_grad_()
        y = PAIRS[kind](a, b)
        g = torch.randn(y.shape, dtype=dtype)
        want, da, db = _reference(kind, a, b, g)
        assert y.dtype == dtype and y.shape == want.shape, name
        torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol, msg=name)
        if y.numel():
            got_a, got_b = torch.autograd.grad(y, (a, b), g)
            torch.testing.assert_close(got_a.double(), da, atol=4 * atol, rtol=4 * rtol, msg=name)
            torch.testing.assert_close(got_b.double(), db, atol=4 * atol, rtol=4 * rtol, msg=name)


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_pair_gradcheck_and_the_packed_ops_agree(kind):
    x = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    f = PAIRS[kind]
    assert torch.autograd.gradcheck(lambda t: f(t[:, :5], t[:, 5:]), (x,))  # through the halves of one leaf
    a, b = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True), torch.randn(2, 3, 5, dtype=torch.float64,
                                                                                       requires_grad=True)
    assert torch.autograd.gradcheck(f, (a, b))
    packed = {"silu": O.silu_and_mul, "gelu": O.gelu_and_mul, "gelu_tanh": lambda t: O.gelu_and_mul(t, "tanh")}[kind]
    assert torch.equal(f(x[:, :5], x[:, 5:]), packed(x))


def test_pair_compile_fullgraph_on_cpu():
    f = torch.compile(lambda x: O.silu_mul(x[..., :4], x[..., 4:]) * 2 + O.gelu_mul(x[..., 4:], x[..., :4], "tanh"),
                      fullgraph=True, dynamic=False)
    x = torch.randn(3, 8)
    want = _ref(x, "silu") * 2 + F.gelu(x[..., 4:], approximate="tanh") * x[..., :4]
    torch.testing.assert_close(f(x), want)


def test_pair_errors_name_the_fix():
    a = torch.randn(3, 4)
    with pytest.raises(SpecError, match=r"silu_mul: gate has shape \(3, 4\) and up \(3, 5\); they must be equal"):
        O.silu_mul(a, torch.randn(3, 5))
    with pytest.raises(SpecError, match=r"gelu_mul: gate has dtype torch.float32 and up torch.float64; convert one "
                                        r"with \.to\(gate\.dtype\)"):
        O.gelu_mul(a, a.double())
    with pytest.raises(SpecError, match="gelu_mul: approximate must be 'none' or 'tanh'"):
        O.gelu_mul(a, a, "fast")
    from opsmith.ops import _functional as fn
    from opsmith.ops._register import ops
    with pytest.raises(SpecError, match="they must be equal"):  # the operator itself checks too
        ops().silu_mul(a, torch.randn(4, 3))
    with pytest.raises(SpecError, match=r"gate is on cpu and up on meta; move one with \.to\(gate\.device\)"):
        fn._gated_pair(a, torch.empty(3, 4, device="meta"), "silu_mul")
    with pytest.raises(SpecError, match=r"silu_mul: grad has shape \(2, 3\), expected \(3, 4\)"):
        fn.gated_mul_bwd("silu", torch.randn(2, 3), a, a)


# -- the CUDA implementations, their kernels carried out on the CPU ---------------------------------------------------
class _Emulated:
    """A gated.cu kernel stood in for on the CPU: checks a launch's arguments against the kernel's
    parsed signature, then does what the kernel does with them -- reads and writes through the
    pointers (1-d spans) with the row strides given, math in float64, one rounding."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def launch(self, config, *args):
        from opsmith._runtime._launch_config import LaunchConfig
        k = self.kernel
        assert isinstance(config, LaunchConfig) and len(args) == len(k.params), (k.name, len(args))
        for p, a in zip(k.params, args):
            if p.kind == "tensor":
                assert isinstance(a, torch.Tensor) and a.dim() == 1 and a.is_contiguous(), (k.name, p.name)
                assert str(a.dtype).replace("torch.", "") in p.dtypes, (k.name, p.name, a.dtype)
            else:
                assert p.kind == "int" and type(a) is int and p.range[0] <= a <= p.range[1], (k.name, p.name, a)
        v = {p.name: a for p, a in zip(k.params, args)}
        if "cols" in v:  # the _one kernels: one 16-byte vector of one row a thread, every address a whole vector
            vec = 16 // v["gate"].element_size()
            rows, d = v["rows"], v["cols"] * vec
            assert config.grid[0] * config.block[0] >= v["cols"] and config.grid[1] * config.block[1] >= rows
            assert all(a.data_ptr() % 16 == 0 for a in v.values() if isinstance(a, torch.Tensor)), k.name
            assert all(v[s] % vec == 0 for s in ("gate_stride", "up_stride", "grad_stride") if s in v), k.name
            v["d"] = d
        else:
            rows, d = v["rows"], v["d"]

        def rows_of(name, stride):
            span = v[name]
            assert (rows - 1) * stride + d <= span.numel(), (k.name, name)  # the kernel stays in its span
            return span.as_strided((rows, d), (stride, 1))

        op = k.name.split("<")[0].removesuffix("_one").rsplit("_", 1)[0]
        act = _act({"silu_and_mul": "silu", "gelu_and_mul": "gelu", "gelu_tanh_and_mul": "gelu_tanh"}[op])
        gate = rows_of("gate", v["gate_stride"]).double().requires_grad_()
        up = rows_of("up", v["up_stride"]).double()
        if "grad_y" not in v:
            rows_of("y", d).copy_(act(gate) * up)
        else:
            g = rows_of("grad_y", d).double()
            (dg,) = torch.autograd.grad(act(gate), gate, g * up)
            rows_of("d_gate", v["grad_stride"]).copy_(dg)
            rows_of("d_up", v["grad_stride"]).copy_(g * act(gate.detach()))
        self.calls.append((k.name, config, v))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_cuda_implementations_give_the_kernels_the_right_pointers_and_strides(dtype, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    import opsmith
    from opsmith.ops import _functional as fn
    from opsmith.ops import _launch, _sources
    jobs = _sources.jobs("sm_90", (dtype,), files=("gated.cu",))
    module = opsmith.CudaModule(opsmith.compile_many(jobs, progress=False)[0])
    calls: list = []

    def kernel(file, name, dt, device):
        assert file == "gated.cu" and dt == dtype
        t, a = _sources.DTYPES[dt]
        return _Emulated(module.get_kernel(name.format(T=t, A=a)), calls)

    monkeypatch.setattr(_sources, "kernel", kernel)
    monkeypatch.setattr(_launch, "device_props", lambda device: _launch.DeviceProps(132, 1024, 2048, 232448, 233472))
    dt = getattr(torch, dtype)
    atol, rtol = TOL[dt]
    for d in (8, 7, 64):
        for name, a, b in _layouts(d, dt):
            for kind in PAIRS:
                g = torch.randn(a.shape, dtype=dt)
                want, da, db = _reference(kind, a, b, g)
                before = len(calls)
                y = fn.gated_mul_fwd(kind, a, b)
                dg, du = fn.gated_mul_bwd(kind, g, a, b)
                assert y.is_contiguous() and dg.is_contiguous() and y.shape == dg.shape == du.shape == a.shape
                assert len(calls) - before == (2 if a.numel() else 0), name
                torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol, msg=f"{name} {kind}")
                torch.testing.assert_close(dg.double(), da, atol=2 * atol, rtol=2 * rtol, msg=f"{name} {kind}")
                torch.testing.assert_close(du.double(), db, atol=2 * atol, rtol=2 * rtol, msg=f"{name} {kind}")
                if name == "halves":  # read in place: the kernel gets the halves' own addresses and strides
                    v = calls[-2][2]
                    assert v["gate"].data_ptr() == a.data_ptr() and v["up"].data_ptr() == b.data_ptr()
                    assert v["gate_stride"] == v["up_stride"] == 2 * d
                if name == "expanded":
                    assert calls[-1][2]["up_stride"] == 0
        x = torch.randn(2, 3, 2 * d + 1, dtype=dt)[..., 1:]  # packed, at an odd offset
        for kind in fn.GATED_KERNELS:
            for packed in (x, x.contiguous(), x.transpose(0, 1)):
                g = torch.randn(*packed.shape[:-1], d, dtype=dt)
                want, da, db = _reference(kind, packed[..., :d], packed[..., d:], g)
                y, dx = fn.gated_fwd(kind, packed), fn.gated_bwd(kind, g, packed)
                torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)
                torch.testing.assert_close(dx.double(), torch.cat([da, db], -1), atol=2 * atol, rtol=2 * rtol)
                v = calls[-2][2]
                if packed is x:  # its rows are evenly spaced: read in place, the halves d apart
                    assert v["gate"].data_ptr() == x.data_ptr() and v["up"].data_ptr() == x[..., d:].data_ptr()
                    assert v["gate_stride"] == v["up_stride"] == 2 * d + 1
                assert calls[-1][2]["grad_stride"] == 2 * d
    names = {n.split("<")[0] for n in _sources.FILES["gated.cu"]}
    if dt.itemsize != 2:  # one row a thread, the _one kernels' grid, is the 16-bit plans'
        names = {n for n in names if not n.endswith("_one")}
    assert {n.split("<")[0] for n, _, _ in calls} == names


def test_gated_plan_covers_every_row_and_column():
    import re

    from opsmith.ops import _launch, _launch_gated, _sources
    source = (_sources.KERNEL_DIR / "gated.cu").read_text()  # the plan and the kernel agree on their numbers
    for macro, value in (("ROWS", _launch_gated.GATED_ROWS), ("ROWS16", _launch_gated.GATED_ROWS16),
                         ("BLOCKS16", _launch_gated.GATED_BLOCKS16)):
        assert re.search(rf"#define OPSMITH_GATED_{macro} (\d+)", source).group(1) == str(value), macro
    assert re.search(r"#define OPSMITH_EW_THREADS (\d+)", source).group(1) == str(_launch.EW_THREADS)
    h100 = _launch.DeviceProps(132, 1024, 2048, 232448, 233472)
    small = _launch.DeviceProps(8, 1024, 1536, 49152, 65536)
    for props in (h100, small):
        for rows, d, itemsize in [(1, 1, 4), (4096, 5632, 2), (4096, 11008, 4), (3, 100000, 2), (10**6, 8, 2),
                                  (10**7, 4, 8), (7, 3, 2), (2048, 2048, 4), (2048, 2048, 2)]:
            for act in _launch_gated.GATED_GRID:
                per_trip, trips, _ = _launch_gated.gated_shape(act, itemsize)
                plan = _launch_gated.gated_plan(rows, d, itemsize, props, act)
                (gx, gy), (tx, ty) = plan.grid, plan.block
                assert tx * ty <= _launch.EW_THREADS and tx & (tx - 1) == 0
                assert gx * tx * (16 // itemsize) >= d  # one trip covers a row
                assert gy * ty * per_trip * trips >= rows or gy == 65535  # else the row loop strides
                assert gy <= -(-rows // ty)  # at most a row a thread
    assert _launch_gated.gated_shape("silu", 2) == _launch_gated.gated_shape("gelu_tanh", 2) == (1, 1, 6)
    assert _launch_gated.gated_shape("gelu", 2) == (2, 4, 2) and _launch_gated.gated_shape("silu", 4) == (2, 1, 4)
    plan = _launch_gated.gated_plan(4096, 5632, 2, h100)  # a Llama MLP's tokens: whole warps along the rows
    assert plan.block == (256, 1) and plan.grid == (3, 4096)  # 16-bit silu: one row a thread
    assert _launch_gated.gated_plan(8, 5632, 2, h100).grid == (3, 8)  # few rows: one a thread, more blocks
    assert _launch_gated.gated_plan(2048, 2048, 2, h100).grid == (1, 2048)
    assert _launch_gated.gated_plan(65536, 1024, 2, h100, "gelu_tanh").grid == (1, 32768)  # two rows a block
    assert _launch_gated.gated_plan(4096, 4096, 4, h100).grid == (4, 2048)  # float silu: two rows a trip
    assert _launch_gated.gated_plan(2048, 2048, 4, h100).grid == (2, 1024)
    assert _launch_gated.gated_plan(1024, 2048, 4, h100).grid == (2, 264)  # two waves of one trip: one wave of two
    assert _launch_gated.gated_plan(8192, 8192, 2, h100, "gelu").grid == (4, 1024)  # the erf GELU: 4 trips a thread
    assert _launch_gated.gated_plan(512, 1024, 2, h100, "gelu").grid == (1, 256)  # but a wave at least


def test_the_gated_kernels_fit_their_launch_bounds():
    """gated.cu's registers a thread, as ptxas reports them through NVRTC on sm_80, sm_90 and sm_100:
    silu and the tanh GELU on 16-bit types at one row a trip fit GATED_BLOCKS16 blocks of 256 threads an
    SM (40 registers), bf16 with no spills (half's silu backward keeps one 8-byte value on the stack,
    read once a row). Float and double, and the erf GELU, at 2 rows a trip and 2 blocks: no spills on
    sm_80 and sm_90."""
    import re

    import opsmith
    from opsmith.ops import _launch, _launch_gated, _sources
    limit = 65536 // (_launch_gated.GATED_BLOCKS16 * _launch.EW_THREADS) // 8 * 8
    jobs = [{**j, "options": ["--ptxas-options=-v"]} for arch in ("sm_80", "sm_90", "sm_100")
            for j in _sources.jobs(arch, ("bfloat16", "float16", "float32", "float64"), ("gated.cu",))]
    for job, binary in zip(jobs, opsmith.compile_many(jobs, progress=False)):
        kernels = re.findall(r"Compiling entry function '(\w+)'[^\n]*\n[^\n]*\n\D*(\d+) bytes stack frame, (\d+) bytes "
                             r"spill stores, (\d+) bytes spill loads\s+ptxas info\s+: Used (\d+) registers", binary.log)
        assert len(kernels) == len(job["name_expressions"]) == 10, (job["arch"], binary.log)
        for name, _, stores, loads, regs in kernels:
            sixteen = "__nv_bfloat16" in name or "__half" in name
            where = (job["arch"], name, stores, regs)
            if "_one" in name:  # a vector a thread: fewer registers than the limit on every type, no spills
                assert int(regs) <= limit and int(stores) == 0, where
            elif sixteen and "gelu_and_mul" not in name:
                assert int(regs) <= limit, where
                assert "__half" in name or int(stores) == 0, where
            elif job["arch"] != "sm_100":
                assert int(stores) == int(loads) == 0, where


def test_the_one_vector_kernels_take_only_what_they_can():
    from opsmith.ops import _launch, _launch_gated
    h100 = _launch.DeviceProps(132, 1024, 2048, 232448, 233472)

    def one(rows, d, itemsize=2, act="silu", addresses=(0, 4096, 8192), strides=None):
        plan = _launch_gated.gated_plan(rows, d, itemsize, h100, act)
        return _launch_gated.gated_one(plan, rows, d, itemsize, act, addresses, strides or (2 * d, 2 * d))

    assert one(2048, 2048) and one(2048, 2048, act="gelu_tanh") and one(8, 5632) and one(3, 8)
    assert one(65535, 2048)  # 65,535 row blocks of one row: the grid's limit
    assert not one(65536, 2048)  # more rows than one trip of the capped grid covers: the looping kernel
    assert not one(2048, 2048, act="gelu") and not one(2048, 2048, itemsize=4)  # two rows a trip
    assert not one(2048, 2044) and not one(2048, 2048, strides=(4100, 4096))  # not whole vectors
    assert not one(2048, 2048, addresses=(0, 4098, 8192))  # a view 2 bytes in
    assert not one(4, 2048, strides=(2**31, 4096))  # past the kernels' int strides
    assert one(4, 2048, strides=(0, 4096))  # an expanded row: every row reads the same vectors
