"""The L2 flushes a GPU benchmark of bench/ can time under (issue 23; docs/ops.md, "what the flush leaves in L2").

- ``zero``: ``opsmith.ops.benchmark``'s own, as ``triton.testing.do_bench``: ``buf.zero_()`` over twice L2's size,
  plain writes. On the H100 they leave the lines a kernel loaded under L2 evict_last.
- ``last``: first a Triton kernel that reads a buffer of twice L2's size under evict_last (displacing every
  evict_last line the timed call before left), then ``zero``. It leaves L2 full of clean evict_last lines, so it
  moves kernels that use no hint too: a second view, not a clean L2.

``with flush_mode("last"): ops.benchmark(...)`` times under the second.
"""
from __future__ import annotations

import contextlib
import functools

from opsmith.ops import _bench

FLUSHES = ("zero", "last")
_plain = _bench._l2_flusher


@functools.cache
def _read_last():
    """Triton and the kernel (built on first use: Triton is needed for ``last`` alone)."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_last(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_last")
        s = tl.sum(v, axis=0)
        tl.store(out_ptr + tl.program_id(0), s, mask=s == 123456789)  # zeros: never written, the loads kept
    return triton, read_last


def _known(mode: str) -> str:
    if mode not in FLUSHES:
        raise ValueError(f"flush {mode!r}: one of {', '.join(FLUSHES)}")
    return mode


def flusher(mode: str, device):
    """The flush ``mode`` (one of :data:`FLUSHES`) on ``device``, as ``_bench._l2_flusher`` returns it."""
    if _known(mode) == "zero":
        return _plain(device)
    import torch
    plain = _plain(device)
    triton, read_last = _read_last()
    size = 2 * torch.cuda.get_device_properties(device).L2_cache_size // 4
    buf = torch.zeros(size, dtype=torch.int32, device=device)
    out = torch.zeros(triton.cdiv(size, 4096), dtype=torch.int32, device=device)

    def flush():
        read_last[(triton.cdiv(size, 4096),)](buf, out, size, BLOCK=4096)
        plain()
    return flush


@contextlib.contextmanager
def flush_mode(mode: str):
    """``opsmith.ops.benchmark`` flushes with ``mode`` inside the block."""
    _known(mode)
    _bench._l2_flusher = lambda device: flusher(mode, device)
    try:
        yield
    finally:
        _bench._l2_flusher = _plain
