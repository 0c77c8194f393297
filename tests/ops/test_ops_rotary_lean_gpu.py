"""rotary.cu's rotary_lean on CUDA (on as shipped, pinned on here), for float32's common case (neox half tables
[seq, half] beside contiguous [batch, heads, seq, 2 * half]): the ops take it where it applies, and give rotary_qk's
bits there, forward and backward, one tensor and q with k; the cases it does not take keep rotary_qk and the float64
reference."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import opsmith.ops as O
from opsmith.ops import _rotary

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def lean_on(monkeypatch):
    """rotary_lean on for float32, as shipped (_rotary.LEAN_DTYPES), whatever the default."""
    monkeypatch.setattr(_rotary, "LEAN_DTYPES", ("float32",))


@pytest.fixture
def launches(monkeypatch):
    """The tensors' counts of each rotary_lean launch, in order."""
    seen = []
    real = _rotary._launch_lean

    def spy(xs, *args):
        seen.append(len(xs))
        return real(xs, *args)
    monkeypatch.setattr(_rotary, "_launch_lean", spy)
    return seen


def _both(q, k, cos, sin, **kw):
    """rotary_embedding_qk's outputs and its inputs' gradients, and rotary_embedding's for q alone."""
    q, k = (t.detach().requires_grad_() for t in (q, k))
    yq, yk = O.rotary_embedding_qk(q, k, cos, sin, **kw)
    gq, gk = torch.autograd.grad((yq, yk), (q, k), (torch.ones_like(yq), torch.full_like(yk, 0.5)))
    return yq, yk, gq, gk, O.rotary_embedding(q.detach(), cos, sin, **kw)


@pytest.mark.parametrize("shape, kv_heads, half", [((1, 16, 2048, 128), 4, 64), ((2, 8, 33, 64), 8, 32),
                                                   ((3, 5, 7, 16), 1, 8), ((1, 2, 4, 2048), 2, 1024)])
def test_float32_common_case_takes_rotary_lean_with_rotary_qks_bits(launches, monkeypatch, shape, kv_heads, half):
    b, h, s, d = shape
    q = torch.randn(shape, device="cuda")
    k = torch.randn(b, kv_heads, s, d, device="cuda")
    ang = torch.randn(s, half, device="cuda")
    cos, sin = ang.cos(), ang.sin()
    got = _both(q, k, cos, sin)
    assert launches == [2, 2, 1], launches  # q and k forward, their backward, q alone
    monkeypatch.setattr(_rotary, "LEAN_DTYPES", ())
    want = _both(q, k, cos, sin)
    assert launches == [2, 2, 1]
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=0, atol=0)
    c64, s64 = cos.double(), sin.double()
    ref = torch.cat([q.double()[..., :half] * c64 - q.double()[..., half:] * s64,
                     q.double()[..., half:] * c64 + q.double()[..., :half] * s64], -1)
    torch.testing.assert_close(got[0].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["bfloat16", "float16", "positions", "interleaved", "full", "partial", "transposed",
                                  "per-batch", "unaligned", "wide", "table"])
def test_other_cases_keep_rotary_qk_and_match_the_reference(launches, monkeypatch, case):
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(case, torch.float32)
    d = 4096 if case == "wide" else 128  # 4096: 512 vectors of half a row, more than a block's threads
    half = 32 if case == "partial" else d // 2
    x = torch.randn(2, 4, 16, d, device="cuda", dtype=dtype)
    ang, pos = torch.randn(16, half, device="cuda", dtype=torch.float64), None
    if case == "positions":
        ang, pos = torch.randn(40, half, device="cuda", dtype=torch.float64), torch.randint(0, 40, (16,), device="cuda")
    elif case == "full":
        ang = torch.cat([ang, ang], -1)
    elif case == "per-batch":
        ang = torch.randn(2, 1, 16, half, device="cuda", dtype=torch.float64)
    elif case == "transposed":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif case == "unaligned":
        x = torch.randn(x.numel() + 1, device="cuda")[1:].view(x.shape)
    elif case == "table":  # cos and sin [16, 64] float, 8 KiB: one byte past the limit set here
        monkeypatch.setattr(_rotary, "LEAN_TABLE_BYTES", 2 * 16 * 64 * 4 - 1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    y = O.rotary_embedding(x, cos, sin, pos, interleaved=case == "interleaved")
    assert launches == []
    c, s = (cos.double()[pos], sin.double()[pos]) if pos is not None else (cos.double(), sin.double())
    x64 = x.double()
    if case == "interleaved":
        a, b = x64[..., 0::2], x64[..., 1::2]
        want = torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)
    elif case == "full":
        want = x64 * c + torch.cat([-x64[..., d // 2:], x64[..., :d // 2]], -1) * s
    else:
        a, b = x64[..., :half], x64[..., half:2 * half]
        want = torch.cat([a * c - b * s, b * c + a * s, x64[..., 2 * half:]], -1)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol)
