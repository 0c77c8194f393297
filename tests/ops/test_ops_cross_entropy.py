"""cross_entropy on CPU: values against torch.nn.functional.cross_entropy for every reduction,
ignore_index, label smoothing, z-loss (against its formula), gradients (gradcheck in float64),
opcheck of both operators, fake kernels, compile (fullgraph, with the backward), the nn.Module,
errors; the CUDA kernels compiled by NVRTC for every dtype and the CUDA implementations run with
each launch checked against its kernel's signature (every plan: whole rows, rows cut into chunks,
short rows, no rows), and the launch plans on synthetic devices (no GPU needed)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import opsmith.ops as O
from opsmith._errors import SpecError
from opsmith.ops import _cross_entropy as ce
from opsmith.ops._launch import DeviceProps

H100 = DeviceProps(sm_count=132, max_threads_per_block=1024, max_threads_per_sm=2048,
                   smem_per_block_optin=232448, smem_per_sm=233472)
SMALL = DeviceProps(8, 1024, 1536, 49152, 65536)


def _reference(x, t, ignore_index=-100, reduction="mean", eps=0.0, z=0.0):
    """torch's cross-entropy in x's dtype plus z * lse**2 on the valid rows, reduced as torch reduces."""
    rows = F.cross_entropy(x, t, ignore_index=ignore_index, reduction="none", label_smoothing=eps)
    valid = t != ignore_index
    lse = torch.logsumexp(x, 1)
    rows = rows + z * torch.where(valid, lse * lse, torch.zeros((), dtype=x.dtype))
    if reduction == "none":
        return rows
    return rows.sum() / valid.sum() if reduction == "mean" else rows.sum()


def _case(rows=6, vocab=11, dtype=torch.float64, ignore=(2,), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, vocab, generator=g)).to(dtype)
    t = torch.randint(0, vocab, (rows,), generator=g)
    for i in ignore:
        t[i] = -100
    return x, t


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps, z", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-3), (0.25, 1e-2)])
def test_values_and_gradients_match_torch(reduction, eps, z):
    x, t = _case()
    x.requires_grad_()
    y = O.cross_entropy(x, t, reduction=reduction, label_smoothing=eps, z_loss=z)
    want = _reference(x, t, -100, reduction, eps, z)
    assert y.dtype == x.dtype and y.shape == want.shape
    torch.testing.assert_close(y, want)
    if not eps and not z:
        torch.testing.assert_close(y, F.cross_entropy(x, t, reduction=reduction))
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    (exp,) = torch.autograd.grad(want, x, g)
    torch.testing.assert_close(got, exp)
    assert got[2].abs().max() == 0  # the ignored row
    assert torch.autograd.gradcheck(lambda a: O.cross_entropy(a, t, reduction=reduction, label_smoothing=eps,
                                                              z_loss=z), (x,))


def test_ignore_index_16_bit_logits_and_the_statistics():
    x, t = _case(rows=5, vocab=9, ignore=())
    t[1] = t[3] = 7  # ignore_index may be a class
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        xd = x.to(dtype)
        y = O.cross_entropy(xd, t, ignore_index=7, label_smoothing=0.1)
        assert y.dtype == dtype
        want = F.cross_entropy(xd.float(), t, ignore_index=7, label_smoothing=0.1)  # float32 math, one rounding
        torch.testing.assert_close(y, want.to(dtype))
    from opsmith.ops._register import ops
    _, lse, count = ops().cross_entropy(x, t, 7, "sum", 0.0, 0.0)
    valid = t != 7
    assert count.tolist() == [3.0] and lse.dtype == count.dtype == torch.float64
    torch.testing.assert_close(lse, torch.where(valid, torch.logsumexp(x, 1), torch.zeros(())))
    # every row ignored: mean is 0 / 0 (NaN) as torch's, sum 0, and the gradient zero
    xa = x.clone().requires_grad_()
    everything = torch.full((5,), -100)
    assert torch.isnan(O.cross_entropy(xa, everything)) and torch.isnan(F.cross_entropy(x, everything))
    assert O.cross_entropy(xa, everything, reduction="sum") == 0
    (g,) = torch.autograd.grad(O.cross_entropy(xa, everything, reduction="sum"), xa)
    assert g.abs().max() == 0
    # no rows at all
    empty = torch.empty(0, 9, dtype=torch.float64)
    assert torch.isnan(O.cross_entropy(empty, torch.empty(0, dtype=torch.long)))
    assert O.cross_entropy(empty, torch.empty(0, dtype=torch.long), reduction="none").shape == (0,)


def test_z_loss_is_the_mean_of_lse_squared_over_the_valid_rows():
    x, t = _case(rows=8, vocab=13, ignore=(0, 5))
    valid = t != -100
    lse = torch.logsumexp(x, 1)[valid]
    base = O.cross_entropy(x, t)
    torch.testing.assert_close(O.cross_entropy(x, t, z_loss=1e-2) - base, 1e-2 * (lse * lse).mean())
    torch.testing.assert_close(O.cross_entropy(x, t, reduction="sum", z_loss=0.5)
                               - O.cross_entropy(x, t, reduction="sum"), 0.5 * (lse * lse).sum())


def test_opcheck_fake_compile_and_module():
    from opsmith.ops._register import CROSS_ENTROPY_NAMES, ops
    T = ops()
    assert set(CROSS_ENTROPY_NAMES) == {"cross_entropy", "cross_entropy_backward"}
    x, t = _case(rows=5, vocab=7, ignore=(1,))
    for args in ((x.clone().requires_grad_(), t), (x.clone().requires_grad_(), t, -100, "none", 0.1, 1e-3),
                 (x.clone().requires_grad_(), t.clamp(min=0), 3, "sum", 0.0, 0.0)):
        assert set(torch.library.opcheck(T.cross_entropy.default, args).values()) == {"SUCCESS"}, args[2:]
    _, lse, count = T.cross_entropy(x, t)
    for grad, reduction in ((torch.tensor(0.7, dtype=torch.float64), "mean"),
                            (torch.randn(5, dtype=torch.float64), "none")):
        args = (grad, x, t, lse, count, -100, reduction, 0.1, 1e-3)
        assert set(torch.library.opcheck(T.cross_entropy_backward.default, args).values()) == {"SUCCESS"}
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fx, ft = torch.empty(64, 32000, dtype=torch.bfloat16), torch.empty(64, dtype=torch.long)
        loss, lse, count = T.cross_entropy(fx, ft)
        assert loss.shape == () and loss.dtype == torch.bfloat16
        assert lse.shape == (64,) and lse.dtype == count.dtype == torch.float32 and count.shape == (1,)
        assert T.cross_entropy(fx, ft, -100, "none")[0].shape == (64,)
        assert T.cross_entropy_backward(loss, fx, ft, lse, count).shape == fx.shape
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: O.cross_entropy(a, b, label_smoothing=0.1, z_loss=1e-3) * 2,
                      backend="aot_eager", fullgraph=True, dynamic=False)
    xa = x.clone().requires_grad_()
    y = f(xa, t)
    torch.testing.assert_close(y, 2 * _reference(x, t, eps=0.1, z=1e-3))
    (got,) = torch.autograd.grad(y, xa)
    xb = x.clone().requires_grad_()
    (exp,) = torch.autograd.grad(2 * _reference(xb, t, eps=0.1, z=1e-3), xb)
    torch.testing.assert_close(got, exp)
    m = O.CrossEntropyLoss(ignore_index=3, reduction="sum", label_smoothing=0.2, z_loss=1e-4)
    t3 = t.clamp(min=0)
    assert torch.equal(m(x, t3), O.cross_entropy(x, t3, ignore_index=3, reduction="sum", label_smoothing=0.2,
                                                 z_loss=1e-4))
    assert "reduction='sum'" in repr(m) and "z_loss=0.0001" in repr(m)


def test_errors_name_the_fix():
    x, t = _case(rows=4, vocab=5, ignore=())
    with pytest.raises(SpecError, match=r"logits must be \[N, V\].*flatten the leading dims"):
        O.cross_entropy(x[None], t[None])
    with pytest.raises(SpecError, match=r"target must be \[N\] = \[4\]"):
        O.cross_entropy(x, t[:3])
    with pytest.raises(SpecError, match=r"target must be torch.long \(int64\).*target.long\(\)"):
        O.cross_entropy(x, t.int())
    with pytest.raises(SpecError, match="class probabilities"):
        O.cross_entropy(x, torch.softmax(x, 1))
    with pytest.raises(SpecError, match="logits must be floating point"):
        O.cross_entropy(t[:, None].repeat(1, 5), t)
    with pytest.raises(SpecError, match="reduction must be 'mean', 'sum' or 'none'"):
        O.cross_entropy(x, t, reduction="batchmean")
    with pytest.raises(SpecError, match=r"label_smoothing must be in \[0, 1\]"):
        O.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(SpecError, match="z_loss is the coefficient of lse\\*\\*2 and must be finite and >= 0"):
        O.cross_entropy(x, t, z_loss=-1e-4)
    with pytest.raises(SpecError, match="no classes"):
        O.cross_entropy(x[:, :0], t)
    bad = t.clone()
    bad[2] = 5
    with pytest.raises(SpecError, match=r"target\[2\] = 5 is not a class index in \[0, 5\) nor ignore_index"):
        O.cross_entropy(x, bad)
    with pytest.raises(SpecError, match="target is on meta and logits on cpu"):
        ce.check(x, torch.empty(4, dtype=torch.long, device="meta"), "mean", 0.0, 0.0)
    from opsmith.ops._register import ops
    with pytest.raises(SpecError, match="reduction must be"):  # the operator itself checks too
        ops().cross_entropy(x, t, -100, "avg")
    with pytest.raises(SpecError, match=r"the loss's gradient has shape \(3,\), expected \(4,\)"):
        ce._cpu_backward(torch.ones(3), x, t, x[:, 0], x[:1, 0], -100, "none")


def _check_plan(rows, vocab, itemsize, props):
    vec = 16 // itemsize
    p = ce.plan(rows, vocab, itemsize, props)
    threads, bwd_threads = p.fwd.block[0], p.bwd.block[0]
    assert 32 <= threads <= min(ce.FWD_THREADS, props.max_threads_per_block)
    assert 32 <= bwd_threads <= min(ce.THREADS, props.max_threads_per_block)
    for n in (threads, bwd_threads):
        assert n & (n - 1) == 0  # whole warps, a power of two
    # short rows: both take the fewest threads that cover a row in one trip
    if vocab <= 32 * vec * ce.UNROLL:
        assert threads == bwd_threads == 32
    assert p.finish.grid == (1,) and p.finish.block[0] <= props.max_threads_per_block
    assert p.chunk % vec == 0 and p.bwd_chunk % vec == 0  # chunks keep a row's alignment
    assert p.bwd_chunk == ce.BWD_TRIPS * bwd_threads * vec * ce.UNROLL
    splits = -(-vocab // p.chunk)
    assert (splits - 1) * p.chunk < vocab <= splits * p.chunk  # no empty chunk
    assert splits <= -(-vocab // (threads * vec * ce.UNROLL))  # a trip a chunk at least
    assert p.fwd.grid[0] == min(max(1, rows * splits), 2**31 - 1)
    assert p.bwd.grid[0] == min(max(1, rows * -(-vocab // p.bwd_chunk)), 2**31 - 1)
    if rows >= props.sm_count * ce.FWD_BLOCKS:
        assert splits == 1  # enough rows: a block a row
    resident = props.sm_count * max(1, min(ce.FWD_BLOCKS, props.max_threads_per_sm // threads))
    if splits > 1:  # cut rows fill one wave of the blocks the device holds, never a second
        assert rows * splits <= resident
    return p


@pytest.mark.parametrize("props", [H100, SMALL], ids=["h100", "small"])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_plans_cover_every_row_within_the_device_limits(props, itemsize):
    for rows in (0, 1, 3, 64, 4096, 100_000):
        for vocab in (1, 7, 100, 1000, 32000, 50257, 128256, 262144):
            _check_plan(rows, vocab, itemsize, props)
    # few long rows are cut so that every SM gets work
    assert ce.plan(4, 262144, 2, H100).fwd.grid[0] >= 4 * 16
    assert ce.plan(8192, 32000, 2, H100).chunk >= 32000


def test_plans_on_random_shapes_and_devices():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(rows=st.integers(0, 2**31), vocab=st.integers(1, 2**20), itemsize=st.sampled_from([2, 4, 8]),
                      sms=st.integers(1, 200), per_block=st.sampled_from([256, 512, 1024]),
                      per_sm=st.sampled_from([1024, 1536, 2048]))
    def check(rows, vocab, itemsize, sms, per_block, per_sm):
        _check_plan(rows, vocab, itemsize, DeviceProps(sms, per_block, per_sm, 49152, 65536))
    check()


def test_kernels_compile_for_every_dtype_and_take_the_launch_arguments(monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    import opsmith
    from launch_check import CheckedLaunch
    from opsmith.ops import _launch, _sources
    jobs = _sources.jobs("sm_90", files=("cross_entropy.cu",))
    binaries = opsmith.compile_many(jobs, progress=False)
    modules = {}
    for job, b in zip(jobs, binaries):
        assert set(b.lowered_names) == set(job["name_expressions"]) and b.code[:4] == b"\x7fELF"
        assert "warning" not in b.log.lower(), b.log
        modules[job["name_expressions"][0]] = opsmith.CudaModule(b)
    calls = []

    def kernel(file, name, dtype, device):
        assert file == "cross_entropy.cu"
        t, a = _sources.DTYPES[dtype]
        return CheckedLaunch(modules[f"cross_entropy_fwd<{t}, {a}, true>"].get_kernel(name.format(T=t, A=a)), calls)

    monkeypatch.setattr(_sources, "kernel", kernel)
    monkeypatch.setattr(_launch, "device_props", lambda device: H100)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for rows, vocab in ((3, 1), (5, 100), (4096, 50257), (2, 262144), (0, 8)):  # rows, chunks, short, none
            x = torch.zeros(rows, vocab, dtype=dtype)
            t = torch.zeros(rows, dtype=torch.long)
            for reduction, smoothing in (("mean", 0.1), ("sum", 0.0), ("none", 0.1), ("mean", 0.0)):
                loss, lse, count = ce.cross_entropy_cuda(x, t, -100, reduction, smoothing, 1e-4)
                assert loss.shape == (() if reduction != "none" else (rows,)) and loss.dtype == dtype
                assert lse.shape == (rows,) and count.shape == (1,)
                g = torch.ones(loss.shape, dtype=dtype)
                assert ce.cross_entropy_backward_cuda(g, x, t, lse, count, -100, reduction, 0.1, 1e-4).shape == x.shape
    names = {n.split("<")[0] for n, _ in calls}
    assert names == {"cross_entropy_fwd", "cross_entropy_finish", "cross_entropy_bwd"}
    # the forward keeps the rows' sums only for label smoothing
    assert {n.rsplit(",", 1)[1].strip(" >") for n, _ in calls if n.startswith("cross_entropy_fwd")} == {"true", "false"}
    # two rows of 262144: cut into chunks, one block each
    assert (2 * -(-262144 // ce.plan(2, 262144, 2, H100).chunk),) in {c.grid[:1] for _, c in calls}
