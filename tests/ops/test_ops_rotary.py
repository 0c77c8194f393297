"""rotary_embedding on CPU: neox and interleaved layouts against the transformers-style formula,
cos/sin broadcast or indexed by positions, partial rotary dims, gradients (gradcheck), opcheck,
fake kernels, compile, the refused cos/sin gradient, errors, and the CUDA kernel compiled by
NVRTC for every dtype and launched with its signature's arguments (no GPU needed)."""
from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

import opsmith.ops as O
from opsmith._errors import SpecError


def _neox(x, cos, sin):  # transformers' rotate_half form, cos/sin over half the rotary dim
    h = cos.shape[-1]
    a, b, rest = x[..., :h], x[..., h:2 * h], x[..., 2 * h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)


def _gptj(x, cos, sin):
    h = cos.shape[-1]
    a, b = x[..., 0:2 * h:2], x[..., 1:2 * h:2]
    return torch.cat([torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2), x[..., 2 * h:]], dim=-1)


def _angles(rows, half):
    ang = torch.randn(rows, half, dtype=torch.float64)
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("half", [4, 2])  # full and partial rotary dims of head_dim 8
def test_values_and_gradients(interleaved, half):
    ref = _gptj if interleaved else _neox
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)  # [batch, heads, seq, head_dim]
    cos, sin = _angles(5, half)
    y = O.rotary_embedding(x, cos, sin, interleaved=interleaved)
    assert torch.allclose(y, ref(x, cos, sin))
    assert torch.autograd.gradcheck(lambda t: O.rotary_embedding(t, cos, sin, interleaved=interleaved), (x,))
    pos = torch.randint(0, 11, (2, 1, 5))  # per batch, broadcast over heads
    tc, ts = _angles(11, half)
    y = O.rotary_embedding(x, tc, ts, pos, interleaved=interleaved)
    assert torch.allclose(y, ref(x, tc[pos], ts[pos]))
    assert torch.autograd.gradcheck(lambda t: O.rotary_embedding(t, tc, ts, pos, interleaved=interleaved), (x,))


def _rotate_half(x, cos, sin):  # transformers' apply_rotary_pos_emb for one tensor: full-width tables
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def test_full_width_tables_are_transformers_formula_even_when_their_halves_differ():
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()  # q.view(...).transpose(1, 2)
    ang = torch.randn(2, 5, 4, dtype=torch.float64)
    same = torch.cat([ang, ang], -1)[:, None]
    other = torch.randn(2, 1, 5, 8, dtype=torch.float64)  # halves that differ: still the formula, exactly
    for cos, sin in ((same.cos(), same.sin()), (other.cos(), other.sin())):
        y = O.rotary_embedding(x, cos, sin)
        assert torch.allclose(y, _rotate_half(x, cos, sin)) and y.stride() == x.stride()
        assert torch.autograd.gradcheck(lambda t: O.rotary_embedding(t, cos, sin), (x,))
    table = torch.randn(11, 8, dtype=torch.float64)
    pos = torch.randint(0, 11, (2, 1, 5))
    assert torch.allclose(O.rotary_embedding(x, table.cos(), table.sin(), pos), _rotate_half(x, table.cos()[pos],
                                                                                            table.sin()[pos]))
    assert torch.autograd.gradcheck(lambda t: O.rotary_embedding(t, table.cos(), table.sin(), pos), (x,))
    with pytest.raises(SpecError, match=r"for interleaved pairs pass one angle a pair: cos\[..., ::2\]"):
        O.rotary_embedding(x, same.cos(), same.sin(), interleaved=True)


def test_outputs_keep_a_permuted_layout_and_copy_others():
    from opsmith.ops._rotary import _memory_order, out_like
    base = torch.randn(2, 5, 3, 8)
    assert _memory_order(base) is None and out_like(base).is_contiguous()
    assert _memory_order(base.transpose(1, 2)) == (0, 2, 1)
    assert out_like(base.transpose(1, 2)).stride() == base.transpose(1, 2).stride()
    for odd in (base[..., ::2], base.transpose(2, 3), base[:, :, :2]):  # gaps, a strided last dim: contiguous
        assert _memory_order(odd) is None and out_like(odd).is_contiguous()


def test_opcheck_fake_compile_and_refusals():
    from opsmith.ops._register import ROTARY_NAMES, ops
    T = ops()
    x = torch.randn(4, 2, 8, dtype=torch.float64, requires_grad=True)  # [tokens, heads, head_dim]
    cos, sin = _angles(4, 4)
    cos, sin = cos[:, None], sin[:, None]
    pos = torch.arange(4)[:, None]
    tc, ts = _angles(6, 4)
    xt = torch.randn(2, 4, 8, dtype=torch.float64).transpose(0, 1).requires_grad_()  # a permuted x, full tables
    full = torch.randn(4, 1, 8, dtype=torch.float64)
    for args in ((x, cos, sin, None, False), (x, tc, ts, pos, True), (xt, full.cos(), full.sin(), None, False)):
        assert set(torch.library.opcheck(T.rotary_embedding.default, args).values()) == {"SUCCESS"}
    g = torch.randn(4, 2, 8, dtype=torch.float64)
    assert set(torch.library.opcheck(T.rotary_embedding_backward.default, (g, cos, sin, None, False)).values()) \
        == {"SUCCESS"}
    assert set(ROTARY_NAMES) == {"rotary_embedding", "rotary_embedding_backward", "rotary_embedding_qk",
                                 "rotary_embedding_qk_backward"}
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert T.rotary_embedding(torch.empty(2, 4, 64), torch.empty(4, 32), torch.empty(4, 32)).shape == (2, 4, 64)
    f = torch.compile(lambda t: O.rotary_embedding(t, cos.float(), sin.float()) * 2, fullgraph=True, dynamic=False)
    xf = x.detach().float()
    assert torch.allclose(f(xf), _neox(xf, cos.float(), sin.float()) * 2, atol=1e-6)
    with pytest.raises(SpecError, match="gradients for cos and sin are not computed"):
        O.rotary_embedding(x, cos.clone().requires_grad_(), sin).sum().backward()


@pytest.mark.parametrize("tables", ["half", "full", "positions"])
def test_qk_is_each_rotated_alone_with_one_node(tables):
    """rotary_embedding_qk(q, k) == (rotary_embedding(q), rotary_embedding(k)): a transposed q, k
    with fewer heads (grouped-query attention); its gradients (gradcheck, one output unused too),
    opcheck of both ops, fullgraph compile, and the refusals."""
    from opsmith.ops._register import ops
    T = ops()
    q = torch.randn(2, 5, 4, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()  # [batch, heads, seq, d]
    k = torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    pos = None
    if tables == "half":
        cos, sin = _angles(5, 4)
    elif tables == "full":
        ang = torch.randn(2, 1, 5, 8, dtype=torch.float64)
        cos, sin = ang.cos(), ang.sin()
    else:
        cos, sin = _angles(9, 4)
        pos = torch.randint(0, 9, (2, 1, 5))
    yq, yk = O.rotary_embedding_qk(q, k, cos, sin, pos)
    torch.testing.assert_close(yq, O.rotary_embedding(q, cos, sin, pos), rtol=0, atol=0)
    torch.testing.assert_close(yk, O.rotary_embedding(k, cos, sin, pos), rtol=0, atol=0)
    assert yq.stride() == q.stride()
    assert torch.autograd.gradcheck(lambda a, b: O.rotary_embedding_qk(a, b, cos, sin, pos), (q, k))
    assert torch.autograd.gradcheck(lambda a, b: O.rotary_embedding_qk(a, b, cos, sin, pos)[1], (q, k))
    args = (q, k, cos, sin, pos, False)
    assert set(torch.library.opcheck(T.rotary_embedding_qk.default, args).values()) == {"SUCCESS"}
    grads = (q.detach(), k.detach(), cos, sin, pos, False)
    assert set(torch.library.opcheck(T.rotary_embedding_qk_backward.default, grads).values()) == {"SUCCESS"}
    f = torch.compile(lambda a, b: [t * 2 for t in O.rotary_embedding_qk(a, b, cos, sin, pos)], fullgraph=True)
    for got, want in zip(f(q.detach(), k.detach()), (yq, yk)):
        torch.testing.assert_close(got, want.detach() * 2)
    with pytest.raises(SpecError, match="share dtype, device and head dim"):
        O.rotary_embedding_qk(q, k[..., :6], cos, sin, pos)
    with pytest.raises(SpecError, match="share dtype, device and head dim"):
        O.rotary_embedding_qk(q, k.float(), cos, sin, pos)
    with pytest.raises(SpecError, match="gradients for cos and sin are not computed"):
        O.rotary_embedding_qk(q, k, cos.clone().requires_grad_(), sin, pos)[0].sum().backward()


def test_errors_name_the_fix():
    x = torch.randn(2, 5, 8)
    cos, sin = torch.randn(5, 4), torch.randn(5, 4)
    with pytest.raises(SpecError, match="must broadcast against x's leading dims"):
        O.rotary_embedding(x, cos[:4], sin[:4])
    with pytest.raises(SpecError, match="half the rotary dim"):
        O.rotary_embedding(x, torch.randn(5, 5), torch.randn(5, 5))
    with pytest.raises(SpecError, match="must be integers"):
        O.rotary_embedding(x, cos, sin, torch.zeros(2, 5))
    with pytest.raises(SpecError, match="tables"):
        O.rotary_embedding(x, cos[None], sin[None], torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(SpecError, match="1 to 5 dims"):
        O.rotary_embedding(torch.randn(1, 1, 1, 1, 2, 8), cos, sin)


def test_rotary_kernel_compiles_for_every_dtype():
    pytest.importorskip("cuda.bindings.nvrtc")
    from opsmith._build._nvrtc import compile_request, make_request
    from opsmith.ops import _sources
    for job in _sources.jobs("sm_90", files=("rotary.cu", "rotary_ip.cu")):
        b = compile_request(make_request(**job))
        assert set(b.lowered_names) == set(job["name_expressions"]) and b.code[:4] == b"\x7fELF"


@pytest.mark.parametrize("case", ["bhsd_cos_s", "bshd_cos_s1", "bhsd_cos_b1s", "bhsd_pos_b1s", "sd_cos_s",
                                  "bhsd_cos_bhs", "thd_pos_t1"])
def test_merged_leading_dims_find_every_rows_cos_row(case):
    """rotary.cu's row -> cos/sin row arithmetic on the merged dims _lead hands it, emulated here,
    against each row's index through broadcasting (no GPU needed)."""
    from opsmith.ops._rotary import _lead
    shapes = {"bhsd_cos_s": ((2, 3, 5, 8), (5, 4), None), "bshd_cos_s1": ((2, 5, 3, 8), (5, 1, 4), None),
              "bhsd_cos_b1s": ((2, 3, 5, 8), (2, 1, 5, 4), None), "bhsd_pos_b1s": ((2, 3, 5, 8), (11, 4), (2, 1, 5)),
              "sd_cos_s": ((5, 8), (5, 4), None), "bhsd_cos_bhs": ((2, 3, 5, 8), (2, 3, 5, 4), None),
              "thd_pos_t1": ((7, 3, 8), (9, 4), (7, 1))}
    xs, cs, ps = shapes[case]
    x, cos = torch.zeros(xs), torch.zeros(cs)
    pos = torch.randint(0, cs[0], ps) if ps else None
    lead = _lead(x, cos, pos)
    sizes, cstr, pstr = lead[:4], lead[4:8], lead[8:]
    rows = x.numel() // x.shape[-1]
    # the expected cos row of every x row, through broadcasting
    if pos is None:
        idx = torch.arange(cos[..., 0].numel()).reshape(cos.shape[:-1]).expand(xs[:-1]).reshape(-1) * cs[-1]
    else:
        idx = pos.expand(xs[:-1]).reshape(-1) * cs[-1]
    flat_pos = pos.reshape(-1) if pos is not None else None
    for r in range(rows):
        rest, i = r, [0] * 4
        for k in (3, 2, 1):
            i[k], rest = rest % sizes[k], rest // sizes[k]
        i[0] = rest
        if pos is None:
            coff = sum(a * b for a, b in zip(i, cstr))
        else:
            coff = int(flat_pos[sum(a * b for a, b in zip(i, pstr))]) * cs[-1]
        assert coff == int(idx[r]), (case, r, lead)
    if case in ("bhsd_cos_s", "bhsd_cos_bhs", "sd_cos_s"):  # [b * h (stride 0), s], [b * h * s], [s]
        assert sum(s != 1 for s in sizes) == {"bhsd_cos_s": 2, "bhsd_cos_bhs": 1, "sd_cos_s": 1}[case]


def test_shape_checks_are_remembered_per_shape_and_failures_never():
    from opsmith.ops import _rotary
    x, cos = torch.zeros(2, 3, 5, 8), torch.zeros(5, 4)
    first = _rotary._checked(x, cos, cos, None, False)
    assert first == (4, False, None, _rotary._lead(x, cos, None)) and _rotary._checked(x, cos, cos, None, False) is first
    pos = torch.zeros(2, 1, 5, dtype=torch.long)
    assert _rotary._checked(x, torch.zeros(9, 4), torch.zeros(9, 4), pos, False)[3] == \
        _rotary._lead(x, torch.zeros(9, 4), pos)
    for _ in range(2):  # a bad argument raises on every call: nothing was stored for it
        with pytest.raises(SpecError, match="positions must be integers"):
            _rotary._checked(x, torch.zeros(9, 4), torch.zeros(9, 4), pos.float(), False)


def test_launch_plan_covers_every_row_and_pair():
    """rotary's plan and kernel agree on the rows a thread takes a trip (OPSMITH_ROTARY_ROWS, float16's with half
    tables OPSMITH_ROTARY_ROWS_HALF, where a row is one 16-byte chunk a thread and nothing is copied); one trip of
    the grid covers every row and every pair of it, within a block of EW_THREADS."""
    import re

    from opsmith.ops import _launch, _rotary, _sources
    source = (_sources.KERNEL_DIR / "rotary.cuh").read_text()
    assert re.search(r"#define OPSMITH_ROTARY_ROWS (\d+)", source).group(1) == str(_rotary.ROTARY_ROWS)
    assert re.search(r"#define OPSMITH_ROTARY_ROWS_HALF (\d+)", source).group(1) == str(_rotary.ROTARY_ROWS_HALF)
    assert "template <> struct RotaryRows<__half> { static constexpr int R = OPSMITH_ROTARY_ROWS_HALF; };" in source
    assert "rotate_rows<T, N, FULL ? OPSMITH_ROTARY_ROWS : RotaryRows<T>::R, FULL, IP>(" in source
    assert [_rotary.rows_a_trip(dt, full) for dt in ("float16", "bfloat16", "float32", "float64")
            for full in (False, True)] == [_rotary.ROTARY_ROWS_HALF] + [_rotary.ROTARY_ROWS] * 7
    props = _launch.DeviceProps(132, 1024, 2048, 232448, 233472)
    for (rows, d, half, itemsize), trip in itertools.product(
            [(524288, 128, 64, 2), (7, 128, 64, 4), (1, 64, 32, 2), (1000, 96, 32, 2), (33, 128, 60, 2),
             (5, 4096, 2048, 2), (10, 6, 3, 8), (1001, 128, 64, 2), (64, 128, 64, 4)], (1, 2)):
        plan = _rotary._plan(rows, d, half, itemsize, props, trip)
        (grid,), (tpr, by) = plan.grid, plan.block
        vec = 16 // itemsize if half % (16 // itemsize) == 0 and d % (16 // itemsize) == 0 else 1
        assert tpr * by <= _launch.EW_THREADS and tpr * vec >= min(half, _launch.EW_THREADS * vec)
        per_trip = trip if vec > 1 and d == 2 * half and half // vec <= tpr else 1
        assert grid * by * per_trip >= rows and (grid - 1) * by * per_trip < rows
    # q of [1, 32, 16384, 128] bf16: 8 threads a row, 32 rows a block, ROTARY_ROWS rows a thread; float16 2
    assert _rotary._plan(524288, 128, 64, 2, props, 2).grid == (524288 // (32 * 2),)
    assert _rotary._plan(524288, 128, 64, 2, props).grid == (524288 // (32 * _rotary.ROTARY_ROWS),)


def test_qk_plan_gives_q_and_k_a_grid_row_each_below_the_across_tables(monkeypatch):
    """rotary_qk's grid: two rows of blocks (q's, then k's) where the tables of the positions hold less than
    OPSMITH_ROTARY_ACROSS_BYTES, one row of q's and k's blocks alternating from there (the kernel reads which from
    gridDim.y); each tensor gets the blocks of the longer one."""
    import re

    from opsmith.ops import _launch, _rotary, _sources
    source = (_sources.KERNEL_DIR / "rotary.cuh").read_text()
    shift = re.search(r"#define OPSMITH_ROTARY_ACROSS_BYTES \((\d+)ll << (\d+)\)", source).groups()
    assert int(shift[0]) << int(shift[1]) == _rotary.QK_HALVES_BELOW
    assert "const bool halves_ = gridDim.y > 1;" in source
    props = _launch.DeviceProps(132, 1024, 2048, 232448, 233472)
    monkeypatch.setattr(_launch, "device_props", lambda device: props)
    for dtype, seq, heads_k, full, positions, halves in [
            (torch.float32, 2048, 16, False, False, True), (torch.float32, 16384, 16, False, False, False),
            (torch.float32, 16383, 4, False, False, True), (torch.bfloat16, 32768, 8, False, False, False),
            (torch.bfloat16, 16384, 32, False, False, True), (torch.float32, 8192, 8, True, False, False),
            (torch.float32, 4096, 8, True, True, True), (torch.float16, 65536, 1, False, True, False)]:
        q, k = torch.empty(1, 16, seq, 128, dtype=dtype), torch.empty(1, heads_k, seq, 128, dtype=dtype)
        cos = torch.empty(seq, 128 if full else 64, dtype=dtype)
        pos = torch.arange(seq)[None] if positions else None
        half, is_full, _, lead = _rotary._checked(q, cos, cos, pos, False)
        assert (half, is_full) == (64, full)
        rows_q, rows_k = q.numel() // 128, k.numel() // 128
        dt = str(dtype).removeprefix("torch.")
        plan = _rotary.plan_qk(q, rows_q, rows_k, half, full, dt, lead)
        n = _rotary.plan_one(q, max(rows_q, rows_k), half, full, dt).grid[0]
        assert plan.grid == ((n, 2) if halves else (2 * n,)), (dtype, seq, full, positions)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "gaps"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_inplace_writes_the_out_of_place_result_into_x(layout, interleaved):
    """inplace=True: x holds rotary_embedding's result and is returned; a partial rotary dim leaves the rest as it
    was; a contiguous, a transposed and a gapped x (a slice of a packed qkv: rotated, then copied back)."""
    base = torch.randn(2, 5, 3, 12, dtype=torch.float64)
    x = {"contiguous": base, "transposed": base.transpose(1, 2), "gaps": base[..., :8]}[layout]
    for half in (x.shape[-1] // 2, 2):
        cos, sin = _angles(3 if layout != "transposed" else 5, half)
        if layout != "transposed":
            cos, sin = cos[:, None].expand(3, 1, half).squeeze(1), sin[:, None].squeeze(1)
        want = O.rotary_embedding(x, cos, sin, interleaved=interleaved)
        before = base.clone()
        got = O.rotary_embedding(x, cos, sin, interleaved=interleaved, inplace=True)
        assert got is x and torch.equal(x, want)
        if layout == "gaps":  # the packed tensor's other columns are untouched
            assert torch.equal(base[..., 8:], before[..., 8:])
        base.copy_(before)


@pytest.mark.parametrize("tables", ["half", "full", "positions"])
def test_inplace_qk_gradients_opcheck_and_compile(tables):
    """rotary_embedding_qk(inplace=True) == the out-of-place pair; the gradient through the in-place ops (an op's
    output rotated in place, gradcheck; one output unused), opcheck of rotary_embedding_ and rotary_embedding_qk_,
    and fullgraph compile with and without autograd."""
    from opsmith.ops._register import ops
    T = ops()
    q = torch.randn(2, 5, 4, 8, dtype=torch.float64).transpose(1, 2)  # [batch, heads, seq, d], transposed
    k = torch.randn(2, 2, 5, 8, dtype=torch.float64)
    pos = None
    if tables == "half":
        cos, sin = _angles(5, 4)
    elif tables == "full":
        ang = torch.randn(2, 1, 5, 8, dtype=torch.float64)
        cos, sin = ang.cos(), ang.sin()
    else:
        cos, sin = _angles(9, 4)
        pos = torch.randint(0, 9, (2, 1, 5))
    wq, wk = O.rotary_embedding_qk(q, k, cos, sin, pos)
    q2, k2 = q.clone(), k.clone()
    got = O.rotary_embedding_qk(q2, k2, cos, sin, pos, inplace=True)
    assert got[0] is q2 and got[1] is k2 and torch.equal(q2, wq) and torch.equal(k2, wk)
    assert torch.autograd.gradcheck(lambda a, b: O.rotary_embedding_qk(a * 1, b * 1, cos, sin, pos, inplace=True),
                                    (q.clone().requires_grad_(), k.clone().requires_grad_()))
    assert torch.autograd.gradcheck(lambda a, b: O.rotary_embedding_qk(a * 1, b * 1, cos, sin, pos, inplace=True)[1],
                                    (q.clone().requires_grad_(), k.clone().requires_grad_()))
    assert torch.autograd.gradcheck(lambda a: O.rotary_embedding(a * 1, cos, sin, pos, inplace=True),
                                    (q.clone().requires_grad_(),))
    for op, args in ((T.rotary_embedding_.default, (q.clone(), cos, sin, pos, False)),
                     (T.rotary_embedding_qk_.default, (q.clone(), k.clone(), cos, sin, pos, False))):
        assert set(torch.library.opcheck(op, args).values()) == {"SUCCESS"}

    def step(a, b):
        a, b = a * 2, b * 2
        O.rotary_embedding_qk(a, b, cos, sin, pos, inplace=True)
        return a + 1, b + 1
    f = torch.compile(step, fullgraph=True, dynamic=False)
    for gotc, want in zip(f(q, k), (wq, wk)):
        torch.testing.assert_close(gotc, O.rotary_embedding(want * 0 + 1, cos, sin, pos) * 0 + want * 2 + 1)
    qg = q.clone().requires_grad_()
    g = torch.compile(lambda a: O.rotary_embedding(a * 1.0, cos, sin, pos, inplace=True).square().sum(), fullgraph=True)
    g(qg).backward()
    qe = q.clone().requires_grad_()
    O.rotary_embedding(qe * 1.0, cos, sin, pos).square().sum().backward()
    torch.testing.assert_close(qg.grad, qe.grad)


def test_inplace_refusals_name_the_fix():
    x = torch.randn(2, 5, 8)
    cos, sin = torch.randn(5, 4), torch.randn(5, 4)
    with pytest.raises(SpecError, match="leaf tensor that requires grad.*inplace=False"):
        O.rotary_embedding(x.clone().requires_grad_(), cos, sin, inplace=True)
    with pytest.raises(SpecError, match="expanded view .stride 0 along dim 0.*x.clone"):
        O.rotary_embedding(torch.randn(1, 5, 8).expand(2, 5, 8), cos, sin, inplace=True)
    with pytest.raises(SpecError, match="q and k must not share memory"):
        O.rotary_embedding_qk(x, x, cos, sin, inplace=True)
    with pytest.raises(SpecError, match="q and k must not share memory"):  # two dense views that meet
        O.rotary_embedding_qk(x[:, None][:1].expand(1, 1, 5, 8).squeeze(1), x[:1], cos, sin, inplace=True)
    four = torch.randn(4, 5, 8)
    with pytest.raises(SpecError, match="q and k must not share memory"):
        O.rotary_embedding_qk(four[:3], four[2:], cos, sin, inplace=True)
    packed = torch.randn(2, 5, 16)  # q and k side by side in one tensor: no overlap, each in place
    q, k = packed[..., :8], packed[..., 8:]
    wq, wk = O.rotary_embedding_qk(q, k, cos, sin)
    O.rotary_embedding_qk(q, k, cos, sin, inplace=True)
    assert torch.equal(q, wq) and torch.equal(k, wk)
    with pytest.raises(SpecError, match="must broadcast against x's leading dims"):
        O.rotary_embedding(x, cos[:4], sin[:4], inplace=True)
    with pytest.raises(SpecError, match="gradients for cos and sin are not computed"):
        O.rotary_embedding(x.clone().requires_grad_() * 1, cos.clone().requires_grad_(), sin,
                           inplace=True).sum().backward()


def test_inplace_ops_bump_versions_and_refuse_a_write_autograd_would_miss():
    from opsmith.ops._register import ops
    T = ops()
    cos, sin = torch.randn(5, 4), torch.randn(5, 4)
    x = torch.randn(2, 5, 8)
    v = x._version
    O.rotary_embedding(x, cos, sin, inplace=True)
    q, k = torch.randn(2, 5, 8), torch.randn(1, 5, 8)
    vq, vk = q._version, k._version
    O.rotary_embedding_qk(q, k, cos, sin, inplace=True)
    assert x._version > v and q._version > vq and k._version > vk
    h = torch.randn(2, 5, 8, requires_grad=True)
    y = h * 1
    z = (y * y).sum()  # saves y for its backward
    with torch.no_grad():
        O.rotary_embedding(y, cos, sin, inplace=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    with pytest.raises(SpecError, match=r"rotary_embedding_ has no autograd formula.*inplace=True"):
        T.rotary_embedding_(h * 1, cos, sin)
    with pytest.raises(SpecError, match=r"rotary_embedding_qk_ has no autograd formula"):
        T.rotary_embedding_qk_(h * 1, k, cos, sin)
    with torch.inference_mode():  # inference tensors have no version counter: rotated all the same
        xi = torch.randn(2, 5, 8)
        want = O.rotary_embedding(xi, cos, sin)
        O.rotary_embedding(xi, cos, sin, inplace=True)
        assert torch.equal(xi, want)
