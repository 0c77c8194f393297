"""cross_entropy on CUDA: loss and gradient against a float64 reference for every dtype, every
reduction, ignore_index, label smoothing and z-loss, rows of 1 to 262,144 classes (odd widths,
rows and views that are not 16-byte aligned, few long rows cut into chunks); inf and NaN rows
against torch on the same device; the same bits every run; the device-side assertion on an
out-of-range target (in a subprocess: it ends the CUDA context); gradcheck, opcheck, compile."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import opsmith.ops as O

pytestmark = pytest.mark.gpu

# (atol, rtol) of the loss against float64 on the same (rounded) logits: the output's rounding
# to its dtype plus float32 arithmetic; the gradient's atol is relative to its largest element
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-10), torch.float16: (1e-3, 2e-3),
       torch.bfloat16: (8e-3, 1.6e-2)}


def _reference(x, t, ignore_index, reduction, eps, z):
    """(loss, d loss / d x for the upstream gradient g) in float64, torch's formula plus z * lse**2."""
    x64 = x.detach().double().requires_grad_()
    rows = F.cross_entropy(x64, t, ignore_index=ignore_index, reduction="none", label_smoothing=eps)
    valid = t != ignore_index
    lse = torch.logsumexp(x64, 1)
    rows = rows + z * torch.where(valid, lse * lse, torch.zeros((), dtype=torch.float64, device=x.device))
    if reduction == "none":
        return x64, rows
    return x64, (rows.sum() / valid.sum() if reduction == "mean" else rows.sum())


def _logits(rows, vocab, dtype, offset=0, scale=3.0):
    """[rows, vocab] logits starting `offset` elements into their storage (offset 1: no row is
    16-byte aligned)."""
    base = scale * torch.randn(rows * vocab + offset, device="cuda", dtype=torch.float32)
    return base.to(dtype)[offset:].view(rows, vocab)


def _check(x, t, ignore_index=-100, reduction="mean", eps=0.0, z=0.0):
    x = x.detach().requires_grad_()
    y = O.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction, label_smoothing=eps, z_loss=z)
    x64, want = _reference(x, t, ignore_index, reduction, eps, z)
    atol, rtol = TOL[x.dtype]
    assert y.dtype == x.dtype and y.shape == want.shape
    torch.testing.assert_close(y.double(), want.detach(), atol=atol * max(1.0, want.abs().max().item()), rtol=rtol)
    g = torch.rand_like(y) + 0.5
    (got,) = torch.autograd.grad(y, x, g)
    (exp,) = torch.autograd.grad(want, x64, g.double())
    scale = exp.abs().max().item() or 1.0
    torch.testing.assert_close(got.double(), exp, atol=2 * atol * scale, rtol=2 * rtol)
    valid = t != ignore_index
    if (~valid).any():
        assert got[~valid].abs().max() == 0


@pytest.mark.parametrize("dtype", sorted(TOL, key=str))
@pytest.mark.parametrize("vocab", [1, 7, 100, 1000, 4097, 32000, 50257, 128256])
def test_matches_float64_reference(dtype, vocab):
    rows = 37 if vocab < 100_000 else 9
    t = torch.randint(0, vocab, (rows,), device="cuda")
    t[3] = -100
    for offset in (0, 1):
        x = _logits(rows, vocab, dtype, offset)
        _check(x, t)
        _check(x, t, reduction="sum", eps=0.1)
        _check(x, t, reduction="none", z=1e-3)
        _check(x, t, reduction="mean", eps=0.3, z=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_long_rows_few_rows_and_many_rows(dtype):
    for rows, vocab in ((1, 262144), (3, 262144), (2, 200003), (4096, 2048), (20000, 33)):
        t = torch.randint(0, vocab, (rows,), device="cuda")
        t[0] = -100 if rows > 1 else t[0]
        x = _logits(rows, vocab, dtype, offset=rows % 2)
        _check(x, t, reduction="mean", eps=0.1, z=1e-4)
        _check(x, t, reduction="none")


def test_large_bf16_against_torch_and_the_same_bits_every_run():
    x = _logits(4096, 32000, torch.bfloat16).requires_grad_()
    t = torch.randint(0, 32000, (4096,), device="cuda")
    t[::7] = -100
    y = O.cross_entropy(x, t)
    want = F.cross_entropy(x.float(), t)
    torch.testing.assert_close(y.float(), want, atol=1e-2, rtol=1e-2)
    (g1,) = torch.autograd.grad(y, x)
    (gw,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(g1.float(), gw.float(), atol=1e-7, rtol=1.6e-2)
    y2 = O.cross_entropy(x, t)
    (g2,) = torch.autograd.grad(y2, x)
    assert torch.equal(y, y2) and torch.equal(g1, g2)  # a fixed reduction order: the same bits every run
    x_before = x.detach().clone()
    O.cross_entropy(x, t).backward()
    assert torch.equal(x.detach(), x_before)  # the logits are never written


def test_inf_and_nan_rows_as_torch():
    for dtype in (torch.float32, torch.bfloat16):
        for vocab in (5, 37, 20001):
            x = torch.randn(6, vocab, device="cuda").to(dtype)
            t = torch.tensor([0, 1, 2, 3, 4, 0], device="cuda") % vocab
            x[0, vocab // 2] = float("nan")
            x[1, vocab - 1] = float("inf")
            x[2] = float("-inf")
            x[3, 0] = float("-inf")
            x[4, 4 % vocab] = float("-inf")  # the target itself: an infinite loss
            for eps in (0.0, 0.1):
                got = O.cross_entropy(x, t, reduction="none", label_smoothing=eps).float()
                want = F.cross_entropy(x.float(), t, reduction="none", label_smoothing=eps)
                torch.testing.assert_close(got, want, equal_nan=True, atol=1e-2, rtol=1e-2)


def test_out_of_range_target_is_a_device_side_assertion(tmp_path):
    code = textwrap.dedent("""
        import torch, opsmith.ops as O
        x = torch.randn(4, 10, device="cuda")
        O.cross_entropy(x, torch.tensor([0, 1, -100, 3], device="cuda")).item()  # fine
        O.cross_entropy(x, torch.tensor([0, 10, 2, 3], device="cuda")).item()
        print("no assertion")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode != 0 and "no assertion" not in out.stdout
    assert "target in [0, V) or ignore_index" in out.stderr or "device-side assert" in out.stderr, out.stderr[-2000:]


def test_gradcheck_opcheck_compile():
    x = torch.randn(5, 33, device="cuda", dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 32, -100, 7, 7], device="cuda")
    for reduction in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(
            lambda a, r=reduction: O.cross_entropy(a, t, reduction=r, label_smoothing=0.1, z_loss=1e-2), (x,))
    from opsmith.ops._register import ops
    T = ops()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        xd = x.detach().to(dtype).requires_grad_()
        for args in ((xd, t), (xd, t, -100, "none", 0.1, 1e-3), (xd, t.clamp(min=0), 7, "sum", 0.0, 0.0)):
            assert set(torch.library.opcheck(T.cross_entropy.default, args).values()) == {"SUCCESS"}, (dtype, args[2:])
        _, lse, count = T.cross_entropy(xd, t)
        g = torch.tensor(0.5, device="cuda", dtype=dtype)
        assert set(torch.library.opcheck(T.cross_entropy_backward.default,
                                         (g, xd.detach(), t, lse, count)).values()) == {"SUCCESS"}
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: O.cross_entropy(a, b, label_smoothing=0.1) * 2, fullgraph=True, dynamic=False)
    xf = x.detach().float().requires_grad_()
    y = f(xf, t)
    torch.testing.assert_close(y, 2 * F.cross_entropy(xf, t, label_smoothing=0.1), atol=1e-5, rtol=1e-5)
    (got,) = torch.autograd.grad(y, xf)
    xr = xf.detach().requires_grad_()
    (exp,) = torch.autograd.grad(2 * F.cross_entropy(xr, t, label_smoothing=0.1), xr)
    torch.testing.assert_close(got, exp, atol=1e-6, rtol=1e-5)


def test_patched_causal_lm_loss_matches_transformers_formula_on_bf16_logits():
    """opsmith.ops.patch's CausalLMLoss (transformers' ForCausalLMLoss without the float copy of the
    logits) against that function written out: the float32 value, the logits' gradient."""
    from test_patch_functions import _hf_loss as hf_loss  # tests/ops is on the path: transformers' function

    from opsmith.ops._patch_loss import CausalLMLoss

    new = CausalLMLoss(hf_loss)
    logits = (torch.randn(2, 512, 32000, device="cuda") * 3).bfloat16().requires_grad_()
    labels = torch.randint(0, 32000, (2, 512), device="cuda")
    labels[:, :17] = -100
    for kw in ({}, {"num_items_in_batch": torch.tensor(700, device="cuda")}):
        got, want = new(logits, labels, 32000, **kw), hf_loss(logits, labels, 32000, **kw)
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        (g,) = torch.autograd.grad(got, logits)
        (w,) = torch.autograd.grad(want, logits)
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w.float(), rtol=1.6e-2, atol=1e-7)
