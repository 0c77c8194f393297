"""rotary.cu's rotary_lean without a GPU: which rotations _rotary.lean gives it (float32's neox half tables [seq, half]
beside contiguous, aligned [..., seq, 2 * half] rows of whole vectors) and which it leaves to rotary_qk, and the
kernel's registers and L2 hint under NVRTC's ptxas (sm_90)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from opsmith.ops import _rotary


@pytest.fixture(autouse=True)
def lean_on(monkeypatch):
    """rotary_lean on for float32, as shipped (pinned here, so that these tests hold whatever the default)."""
    monkeypatch.setattr(_rotary, "LEAN_DTYPES", ("float32",))


def test_lean_is_on_for_float32_alone_as_shipped():
    """tests/ops/test_ops_rotary_lean_gpu.py passed on the H100 and it led rotary_qk against compile on every
    measured shape (docs/ops.md, "rotary's lean kernel"): float32 takes it; the 2-byte types (which lead compile
    through rotary_qk) do not."""
    assert '\nLEAN_DTYPES: tuple = ("float32",)\n' in Path(_rotary.__file__).read_text()  # as shipped, not patched


def _lean(x, cos, positions=None, interleaved=False, k=None):
    """_rotary.lean for x (and k) as rotary_cuda (rotary_qk_cuda) asks it."""
    pairs = []
    for t in (x,) if k is None else (x, k):
        half, full, order, lead = _rotary._checked(t, cos, cos, positions, interleaved)
        tk = t if order is None else t.permute(*order, t.dim() - 1)
        pairs.append((tk, torch.empty_like(tk), t.numel() // t.shape[-1], lead))
    return _rotary.lean(_rotary.fn._dtype_name(x, "rotary"), half, full, interleaved, positions is not None,
                        cos.contiguous(), cos.contiguous(), pairs)


def test_the_common_float32_case_is_lean():
    cos = torch.randn(64, 64)
    assert _lean(torch.randn(1, 16, 64, 128), cos)
    assert _lean(torch.randn(2, 8, 64, 128), cos, k=torch.randn(2, 2, 64, 128))  # k with fewer heads
    assert _lean(torch.randn(64, 128), cos)  # [seq, d]
    assert _lean(torch.randn(3, 64, 16), torch.randn(64, 8))  # 2 vectors a half row
    assert _lean(torch.randn(1, 2, 64, 2048), torch.randn(64, 1024))  # 256 vectors: a block's threads
    assert _lean(torch.randn(2, 64, 128), torch.randn(2, 64, 64))  # per-batch tables merge with the positions


@pytest.mark.parametrize("case", ["bfloat16", "float16", "float64", "positions", "interleaved", "full", "partial",
                                  "odd half", "wide", "transposed", "per-batch", "unaligned", "rows"])
def test_other_rotations_keep_rotary_qk(case, monkeypatch):
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}.get(case, torch.float32)
    d = {"odd half": 132, "wide": 4096}.get(case, 128)  # 66: not whole vectors; 2048: 512 vectors, past 256 threads
    half = {"partial": 32, "full": d}.get(case, d // 2)
    x, cos, pos = torch.randn(2, 4, 64, d, dtype=dtype), torch.randn(64, half, dtype=dtype), None
    if case == "positions":
        cos, pos = torch.randn(100, half), torch.randint(0, 100, (64,))
    elif case == "transposed":  # memory order [batch, seq, heads]: the table does not follow the innermost rows
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif case == "per-batch":  # the table's rows follow the batch too (broadcast over the heads)
        cos = torch.randn(2, 1, 64, half)
    elif case == "unaligned":
        x = torch.randn(x.numel() + 1)[1:].view(x.shape)
    elif case == "rows":
        monkeypatch.setattr(_rotary, "LEAN_ROWS", 2 * 4 * 64)
    assert not _lean(x, cos, pos, interleaved=case == "interleaved")


def test_tables_up_to_the_limit_are_lean(monkeypatch):
    """_rotary.LEAN_TABLE_BYTES on both sides: a table of exactly the limit takes rotary_lean, one row more not."""
    monkeypatch.setattr(_rotary, "LEAN_TABLE_BYTES", 2 * 64 * 64 * 4)  # cos and sin [64, 64] float: 32 KiB
    assert _lean(torch.randn(2, 4, 64, 128), torch.randn(64, 64))
    assert not _lean(torch.randn(2, 4, 65, 128), torch.randn(65, 64))


@pytest.mark.parametrize("k_case", ["transposed", "unaligned"])
def test_q_and_k_are_lean_together_or_not_at_all(k_case):
    q, k = torch.randn(2, 8, 64, 128), torch.randn(2, 2, 64, 128)
    k = k.transpose(1, 2).contiguous().transpose(1, 2) if k_case == "transposed" else \
        torch.randn(k.numel() + 1)[1:].view(k.shape)
    assert not _lean(q, torch.randn(64, 64), k=k)


def test_unaligned_tables_keep_rotary_qk():
    x, cos = torch.randn(1, 4, 64, 128), torch.randn(64 * 64 + 1)[1:].view(64, 64)
    half, full, _, lead = _rotary._checked(x, cos, cos, None, False)
    pairs = [(x, torch.empty_like(x), 256, lead)]
    assert not _rotary.lean("float32", half, full, False, False, cos, cos, pairs)
    assert _rotary.lean("float32", half, full, False, False, cos.clone(), cos.clone(), pairs)


def test_rotary_lean_compiles_in_few_registers_and_its_hint_changes_float_alone():
    """sm_90 (ptxas through NVRTC): rotary_lean holds 32 registers or fewer in every 2- and 4-byte type, no spills
    (rotary_qk<float> holds 40); OPSMITH_ROTARY_LEAN_HINT is on as shipped and changes float's cubin alone."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs cuda-bindings (pip install 'opsmith[cuda]')")
    import opsmith
    from opsmith.ops import _sources
    assert "#define OPSMITH_ROTARY_LEAN_HINT 1" in (_sources.KERNEL_DIR / "rotary.cu").read_text()
    types = ("float", "__half", "__nv_bfloat16")
    jobs = [{"source": _sources.KERNEL_DIR / "rotary.cu", "arch": "sm_90",
             "options": ["--ptxas-options=-v", f"-DOPSMITH_ROTARY_LEAN_HINT={h}"],
             "name_expressions": [f"rotary_lean<{t}>" for t in types]} for h in (1, 0)]
    on, off = opsmith.compile_many(jobs, progress=False)
    used = re.findall(r"Compiling entry function '\w*rotary_lean\w*'[^\n]*\n[^\n]*\n\D*\d+ bytes stack frame, "
                      r"(\d+) bytes spill stores, (\d+) bytes spill loads\s+ptxas info\s+: Used (\d+) registers",
                      on.log)
    assert len(used) == 3 and all((st, ld) == ("0", "0") and int(r) <= 32 for st, ld, r in used), on.log
    single = [{**jobs[h], "name_expressions": [f"rotary_lean<{t}>"]} for t in ("float", "__nv_bfloat16")
              for h in (0, 1)]
    f1, f0, b1, b0 = (b.code for b in opsmith.compile_many(single, progress=False))
    assert f1 != f0 and b1 == b0
