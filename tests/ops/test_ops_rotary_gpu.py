"""rotary_embedding on CUDA: neox and interleaved, cos/sin broadcast or indexed by positions,
partial rotary dims, full-width (transformers') tables on transposed views, against a float64
reference for every dtype; the backward (the inverse rotation) against autograd of the reference;
gradcheck; opcheck; compile; a patched transformers-style apply_rotary_pos_emb."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import opsmith.ops as O

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1.6e-2)}


def _ref(x, cos, sin, interleaved):
    h = cos.shape[-1]
    if interleaved:
        a, b = x[..., 0:2 * h:2], x[..., 1:2 * h:2]
        rot = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    else:
        a, b = x[..., :h], x[..., h:2 * h]
        rot = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    return torch.cat([rot, x[..., 2 * h:]], -1)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape, half, positions", [((2, 4, 16, 64), 32, False), ((2, 4, 16, 64), 16, False),
                                                     ((37, 8, 128), 64, True), ((1, 1, 1, 2), 1, False)])
def test_matches_float64_reference(dtype, interleaved, shape, half, positions):
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    rows = shape[-2] if not positions else 100
    ang = torch.randn(rows, half, device="cuda", dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()
    pos = torch.randint(0, 100, (shape[0], 1), device="cuda") if positions else None
    y = O.rotary_embedding(x, cos.to(dtype), sin.to(dtype), pos, interleaved=interleaved)
    c = cos.to(dtype).double()[pos] if positions else cos.to(dtype).double()
    s = sin.to(dtype).double()[pos] if positions else sin.to(dtype).double()
    _assert_matches(y, x, lambda x64: _ref(x64, c, s, interleaved), dtype)


def _assert_matches(y, x, reference, dtype):
    """``y`` and its gradient against ``reference`` of ``x`` in float64, within the dtype's tolerance."""
    x64 = x.detach().double().requires_grad_()
    want = reference(x64)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    (exp,) = torch.autograd.grad(want, x64, g.double())
    torch.testing.assert_close(got.double(), exp, atol=2 * atol, rtol=2 * rtol)


def _rotate_half_ref(x, cos, sin):  # transformers' formula, full-width tables
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("layout", ["transposed", "contiguous", "positions"])
@pytest.mark.parametrize("d", [128, 64, 6])  # vector path; a row of 3 pairs: one pair a thread
def test_full_width_tables_match_float64_reference(dtype, layout, d):
    b, s, h = 2, 33, 4
    base = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
    x = (base.transpose(1, 2) if layout == "transposed" else base.transpose(1, 2).contiguous()).requires_grad_()
    ang = torch.randn(b, s, d, device="cuda", dtype=torch.float64)  # halves that differ: the formula all the same
    pos = None
    if layout == "positions":
        ang = torch.randn(64, d, device="cuda", dtype=torch.float64)
        pos = torch.randint(0, 64, (b, 1, s), device="cuda")
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    y = O.rotary_embedding(x, cos[:, None] if pos is None else cos, sin[:, None] if pos is None else sin, pos)
    assert y.stride() == x.stride()
    c, sn = (cos.double()[pos], sin.double()[pos]) if pos is not None else (cos.double()[:, None], sin.double()[:, None])
    _assert_matches(y, x, lambda x64: _rotate_half_ref(x64, c, sn), dtype)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("tables", ["half", "full", "positions", "interleaved"])
@pytest.mark.parametrize("kv_heads", [4, 1])
def test_qk_in_one_launch_equals_each_alone(dtype, tables, kv_heads):
    """rotary_embedding_qk's one launch (two rows of blocks below 8 MiB of tables) gives rotary_embedding's bits for
    each, forward and backward: a transposed q, k with as many or fewer heads, vector and
    pair-at-a-time head dims (128, 6)."""
    for d in (128, 6):
        q = torch.randn(2, 33, 4, d, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
        k = torch.randn(2, kv_heads, 33, d, device="cuda", dtype=dtype, requires_grad=True)
        half, pos, interleaved = d // 2, None, tables == "interleaved"
        ang = torch.randn(33, half, device="cuda")
        if tables == "full":
            ang = torch.randn(2, 1, 33, d, device="cuda")
        elif tables == "positions":
            ang, pos = torch.randn(50, half, device="cuda"), torch.randint(0, 50, (2, 1, 33), device="cuda")
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        got = O.rotary_embedding_qk(q, k, cos, sin, pos, interleaved=interleaved)
        want = [O.rotary_embedding(t, cos, sin, pos, interleaved=interleaved) for t in (q, k)]
        g = [torch.randn_like(t) for t in want]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
            assert a.stride() == b.stride()
        for a, b in zip(torch.autograd.grad(got, (q, k), g), torch.autograd.grad(want, (q, k), g)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tables", ["half", "full", "positions", "interleaved"])
@pytest.mark.parametrize("seq", [32768, 32776])
def test_tables_of_8_mib_and_more_take_the_heads_in_turn_and_match_the_reference(dtype, tables, seq):
    """Tables of OPSMITH_ROTARY_ACROSS_BYTES (8 MiB) and more over [1, heads, seq, 128] rows: the kernel takes
    a tile of positions of every head in turn (seq 32768; 32776 is no whole number of tiles: in order), q and k
    in one launch (k with fewer heads) and each alone, forward and backward, against float64."""
    half, pos = 64, None
    q = torch.randn(1, 4, seq, 128, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(1, 2, seq, 128, device="cuda", dtype=dtype, requires_grad=True)
    ang = torch.randn(seq, half, device="cuda", dtype=torch.float64)
    if tables == "full":
        ang = torch.randn(1, 1, seq, 2 * half, device="cuda", dtype=torch.float64)
    elif tables == "positions":
        ang, pos = (torch.randn(seq + 5, half, device="cuda", dtype=torch.float64),
                    torch.randperm(seq, device="cuda")[None, None])
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    inter = tables == "interleaved"
    got = O.rotary_embedding_qk(q, k, cos, sin, pos, interleaved=inter)
    g = [torch.randn_like(y) for y in got]
    grads = torch.autograd.grad(got, (q, k), g)
    for t, y, gy, gx in zip((q, k), got, g, grads):
        c, s = cos.double(), sin.double()
        if pos is not None:
            c, s = c[pos], s[pos]
        if tables == "full":
            ref = lambda x64, c=c, s=s: _rotate_half_ref(x64, c, s)  # noqa: E731
        else:
            ref = lambda x64, c=c, s=s: _ref(x64, c, s, inter)  # noqa: E731
        _assert_matches(O.rotary_embedding(t, cos, sin, pos, interleaved=inter), t, ref, dtype)
        alone = O.rotary_embedding(t, cos, sin, pos, interleaved=inter)
        torch.testing.assert_close(alone, y, rtol=0, atol=0)
        torch.testing.assert_close(torch.autograd.grad(alone, t, gy)[0], gx, rtol=0, atol=0)


def test_patched_transformers_style_function_matches_the_original_and_trains():
    from test_patch_functions import _attention_module  # tests/ops is on the path: transformers' function

    from opsmith.ops._patch_rotary import RotaryPosEmb

    module = _attention_module("gpu_attention")
    apply_rotary_pos_emb = module.apply_rotary_pos_emb
    new = RotaryPosEmb(apply_rotary_pos_emb, vars(module))
    q = torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 1024, 4, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    inv = 1.0 / (10000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    freqs = torch.outer(torch.arange(1024, device="cuda").float(), inv)
    emb = torch.cat([freqs, freqs], -1)[None].expand(2, -1, -1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    got, want = new(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)
    # against the same function in float64 on the same inputs: ours rounds once (half a bf16 ulp). Not against
    # torch's bf16 chain, which rounds three times: where its terms cancel, 1 element in 10^6 lay past any
    # fixed tolerance that is still a check (a gradient of 0.07 where torch's was 0, an H100 run)
    qd, kd = (t.detach().double().requires_grad_() for t in (q, k))
    exact = apply_rotary_pos_emb(qd, kd, cos.double(), sin.double())

    def within_one_rounding(g, e):
        e = e.detach()
        assert ((g.double() - e).abs() <= e.abs() * 2.0**-8 + 1e-6 * e.abs().max()).all(), (g.double() - e).abs().max()

    for g, w, e in zip(got, want, exact):
        within_one_rounding(g, e)
        assert g.shape == w.shape and g.dtype == w.dtype
    ups = [(2 * t.detach().float()).to(t.dtype) for t in got]  # what (t.float() ** 2).sum() sends back, in bf16
    grads = torch.autograd.grad(sum((t.float() ** 2).sum() for t in got), (q, k))
    for g, e in zip(grads, torch.autograd.grad(exact, (qd, kd), [u.double() for u in ups])):
        within_one_rounding(g, e)


def test_gradcheck_opcheck_compile():
    x = torch.randn(3, 2, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    ang = torch.randn(3, 1, 8, device="cuda", dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()
    assert torch.autograd.gradcheck(lambda t: O.rotary_embedding(t, cos, sin), (x,))
    from opsmith.ops._register import ops
    T = ops()
    assert set(torch.library.opcheck(T.rotary_embedding.default, (x, cos, sin, None, True)).values()) == {"SUCCESS"}
    xt = torch.randn(2, 3, 16, device="cuda", dtype=torch.float64).transpose(0, 1).requires_grad_()
    full = torch.randn(3, 1, 16, device="cuda", dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: O.rotary_embedding(t, full.cos(), full.sin()), (xt,))
    assert set(torch.library.opcheck(T.rotary_embedding.default, (xt, full.cos(), full.sin(), None, False)).values()) \
        == {"SUCCESS"}
    f = torch.compile(lambda t: O.rotary_embedding(t, cos.float(), sin.float()).sum(), fullgraph=True, dynamic=False)
    xf = x.detach().float()
    torch.testing.assert_close(f(xf), _ref(xf, cos.float(), sin.float(), False).sum(), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("tables", ["half", "full", "positions", "interleaved", "partial"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "gaps"])
def test_inplace_writes_the_out_of_place_bits(dtype, tables, layout):
    """inplace=True (the rotary_ip kernels; a view with gaps: out of place, copied back) leaves in q and k exactly
    the out-of-place rotation's bits, one tensor and q with k (fewer heads) in one launch, vector and pair-at-a-time
    head dims; a partial rotary dim leaves the rest of each row, and a packed tensor's other columns, as they were;
    the gradient through the in-place rotation equals the out-of-place one's."""
    for d in (128, 6):
        half = 2 if tables == "partial" else d // 2
        width = d + 8 if layout == "gaps" else d
        bq = torch.randn(2, 33, 4, width, device="cuda", dtype=dtype)
        bk = torch.randn(2, 2, 33, width, device="cuda", dtype=dtype)
        q = {"contiguous": bq.transpose(1, 2).contiguous(), "transposed": bq.transpose(1, 2),
             "gaps": bq.transpose(1, 2)[..., :d]}[layout]
        k = bk[..., :d] if layout == "gaps" else bk
        pos, inter = None, tables == "interleaved"
        ang = torch.randn(33, half, device="cuda")
        if tables == "full":
            ang = torch.randn(2, 1, 33, d, device="cuda")
        elif tables == "positions":
            ang, pos = torch.randn(50, half, device="cuda"), torch.randint(0, 50, (2, 1, 33), device="cuda")
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        want = [O.rotary_embedding(t, cos, sin, pos, interleaved=inter) for t in (q, k)]
        before, q0, k0 = [bq.clone(), bk.clone()], q.clone(), k.clone()
        qi = O.rotary_embedding(q, cos, sin, pos, interleaved=inter, inplace=True)
        assert qi is q
        torch.testing.assert_close(q, want[0], rtol=0, atol=0)
        q.copy_(q0)
        got = O.rotary_embedding_qk(q, k, cos, sin, pos, interleaved=inter, inplace=True)
        assert got[0] is q and got[1] is k
        for a, b in zip((q, k), want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        if layout == "gaps":  # the packed tensors' other columns
            for base, old in zip((bq, bk), before):
                torch.testing.assert_close(base[..., d:], old[..., d:], rtol=0, atol=0)
        q.copy_(q0)
        k.copy_(k0)
        # the gradient: q and k as the outputs of an op (a projection), rotated in place
        leaves = [t.detach().clone().requires_grad_() for t in (q, k)]
        rq, rk = O.rotary_embedding_qk(leaves[0] * 1, leaves[1] * 1, cos, sin, pos, interleaved=inter, inplace=True)
        g = [torch.randn_like(t) for t in (rq, rk)]
        got_g = torch.autograd.grad((rq, rk), leaves, g)
        outs = [O.rotary_embedding(t, cos, sin, pos, interleaved=inter) for t in leaves]
        for a, b in zip(got_g, torch.autograd.grad(outs, leaves, g)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_inplace_of_large_tensors_matches_out_of_place_and_compiles(dtype):
    """Tensors of 8 MiB tables and more (the heads taken in turn) and many rows a thread: rotary_ip_qk's bits equal
    the out-of-place ones; fullgraph compile of an in-place rotation, with autograd, gives eager's values and
    gradients; opcheck of both in-place ops on CUDA."""
    seq = 32768
    q = torch.randn(1, 8, seq, 128, device="cuda", dtype=dtype)
    k = torch.randn(1, 2, seq, 128, device="cuda", dtype=dtype)
    ang = torch.randn(seq, 64, device="cuda")
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    want = O.rotary_embedding_qk(q, k, cos, sin)
    O.rotary_embedding_qk(q, k, cos, sin, inplace=True)
    for a, b in zip((q, k), want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    x = torch.randn(2, 4, 64, 128, device="cuda", dtype=dtype, requires_grad=True)
    c, s = cos[:64], sin[:64]
    f = torch.compile(lambda t: O.rotary_embedding(t * 2, c, s, inplace=True).float().square().sum(), fullgraph=True,
                      dynamic=False)
    loss = f(x)
    (got,) = torch.autograd.grad(loss, x)
    ref = O.rotary_embedding(x * 2, c, s).float().square().sum()
    (exp,) = torch.autograd.grad(ref, x)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(loss, ref, atol=atol * 100, rtol=rtol)
    torch.testing.assert_close(got, exp, atol=atol * 10, rtol=rtol * 10)
    from opsmith.ops._register import ops
    T = ops()
    x64 = torch.randn(3, 2, 16, device="cuda", dtype=torch.float64)
    k64 = torch.randn(3, 1, 16, device="cuda", dtype=torch.float64)
    a64 = torch.randn(3, 1, 8, device="cuda", dtype=torch.float64)
    for op, args in ((T.rotary_embedding_.default, (x64.clone(), a64.cos(), a64.sin(), None, True)),
                     (T.rotary_embedding_qk_.default, (x64.clone(), k64.clone(), a64.cos(), a64.sin(), None, False))):
        assert set(torch.library.opcheck(op, args).values()) == {"SUCCESS"}
