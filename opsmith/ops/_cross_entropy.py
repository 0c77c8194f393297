"""Cross-entropy over a vocabulary as torch operators: ``cross_entropy`` and its backward.

==========================  ============================================================================
``cross_entropy``           ``(Tensor logits, Tensor target, int ignore_index=-100, str reduction="mean",
                            float label_smoothing=0.0, float z_loss=0.0) -> (Tensor loss, Tensor lse,
                            Tensor count)``
``cross_entropy_backward``  ``(Tensor grad, Tensor logits, Tensor target, Tensor lse, Tensor count, ...)``
                            ``-> Tensor``: the gradient of the logits
==========================  ============================================================================

``logits`` is ``[N, V]`` (any float dtype), ``target`` ``[N]`` int64 class indices; rows whose
target is ``ignore_index`` count for nothing. Per valid row, with ``lse = logsumexp(logits[i])``::

    loss_i = (1 - eps) * (lse - logits[i, target_i]) + eps * (lse - mean_j logits[i, j]) + z_loss * lse**2

(``eps``: ``label_smoothing``, torch's definition; ``z_loss * lse**2``: PaLM's auxiliary term), 0 for
an ignored row; ``reduction`` ``"mean"`` divides the sum by the number of valid rows (NaN when there
is none, as torch), ``"sum"`` sums, ``"none"`` returns ``loss_i`` (``[N]``). ``loss`` has the
logits' dtype (math in float32, float64 for float64); ``lse`` (``[N]``, 0 for ignored rows) and
``count`` (``[1]``, the number of valid rows) are float32 (float64) and are what the backward reads.

The forward reads the logits once (an online max and sum of exponentials per row). The gradient
is not made in the forward: the backward reads the logits once more and writes the gradient once,
``scale * ((1 + 2 z lse) softmax - eps / V - (1 - eps) onehot(target))``, ``scale`` the upstream
gradient (``/ count`` for mean). So a forward and backward move three logit-sized tensors, with no
host synchronisation, and never write into the logits. The CUDA code (``kernels/cross_entropy.cu``)
is Python-launched on every machine.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

from opsmith._errors import SpecError
from opsmith.ops import _functional as fn
from opsmith.ops import _launch, _sources

__all__ = ["REDUCTIONS", "CEPlan", "check", "cross_entropy_backward_cuda", "cross_entropy_cuda", "define_all",
           "plan"]

REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}  # the kernels' `mode`
# kernels/cross_entropy.cu's compile-time numbers
THREADS = 256          # OPSMITH_CE_THREADS: threads a block of bwd at most
FWD_THREADS = 128      # OPSMITH_CE_FWD_THREADS: threads a block of fwd at most
UNROLL = 4             # OPSMITH_CE_UNROLL: 16-byte vectors per thread per trip
FINISH_THREADS = 1024  # OPSMITH_CE_FINISH_THREADS
FWD_BLOCKS = 8         # OPSMITH_CE_FWD_BLOCKS: fwd blocks an SM holds (the kernel's register budget: 64 a thread)
BWD_TRIPS = 2          # trips of UNROLL vectors per thread in a backward block (two: the block's first
                       # latency, loading its row's target, lse and upstream gradient, is paid once for two)
_FILE = "cross_entropy.cu"
_WHERE = "opsmith.ops.cross_entropy"


def check(logits, target, reduction: str, label_smoothing: float, z_loss: float) -> int:
    """The kernels' reduction mode after checking the arguments (a SpecError that names the fix)."""
    if reduction not in REDUCTIONS:
        raise SpecError(f"{_WHERE}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if logits.dim() != 2:
        raise SpecError(f"{_WHERE}: logits must be [N, V] (rows x classes, the class dim last), got shape "
                        f"{tuple(logits.shape)}; flatten the leading dims: logits.reshape(-1, logits.shape[-1]) "
                        f"and target.reshape(-1)")
    if not logits.dtype.is_floating_point:
        raise SpecError(f"{_WHERE}: logits must be floating point, got {logits.dtype}; convert with logits.float()")
    if target.dtype.is_floating_point or target.dtype.is_complex:
        raise SpecError(f"{_WHERE}: target must hold class indices (torch.long); class probabilities (soft "
                        f"labels, {target.dtype}) are not supported")
    if target.dtype != _long():
        raise SpecError(f"{_WHERE}: target must be torch.long (int64) class indices, got {target.dtype}; "
                        f"convert with target.long()")
    rows, vocab = logits.shape
    if tuple(target.shape) != (rows,):
        raise SpecError(f"{_WHERE}: target must be [N] = [{rows}] for logits of shape {tuple(logits.shape)}, got "
                        f"shape {tuple(target.shape)}")
    if target.device != logits.device:
        raise SpecError(f"{_WHERE}: target is on {target.device} and logits on {logits.device}; move it with "
                        f"target.to(logits.device)")
    if vocab == 0:
        raise SpecError(f"{_WHERE}: logits have no classes (shape {tuple(logits.shape)})")
    if not 0.0 <= label_smoothing <= 1.0:
        raise SpecError(f"{_WHERE}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not (z_loss >= 0.0 and math.isfinite(z_loss)):
        raise SpecError(f"{_WHERE}: z_loss is the coefficient of lse**2 and must be finite and >= 0 (PaLM uses "
                        f"1e-4), got {z_loss}")
    return REDUCTIONS[reduction]


def _long():
    import torch
    return torch.long


class CEPlan(NamedTuple):
    """The launches of one shape: the forward (its unit is ``chunk`` elements of a row: a whole
    row unless rows are too few to fill the device), the finishing block, the backward (its unit
    is ``bwd_chunk`` elements of a row)."""

    fwd: _launch.Plan
    chunk: int
    finish: _launch.Plan
    bwd: _launch.Plan
    bwd_chunk: int


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=1024)
def plan(rows: int, vocab: int, itemsize: int, props: _launch.DeviceProps) -> CEPlan:
    """The launches for ``rows`` rows of ``vocab`` logits of ``itemsize`` bytes on a device.

    A forward block has at most ``FWD_THREADS`` threads, a backward block ``THREADS``, fewer for short rows (a
    power of two >= 32 that covers the row in one trip of ``UNROLL`` vectors). The forward gives each block a row;
    when rows are fewer than the blocks the device holds at once, it cuts rows into as many chunks (at least one
    trip each) as one wave of those blocks takes, so that every SM gets work and no block waits for a second
    wave, and the finishing block merges them. The backward gives each block ``BWD_TRIPS`` trips of a row.

    The forward's blocks of 128 threads, 8 an SM (the same 64 registers a thread as 256 x 4), H100, kernels alone,
    bf16, L2 flushed (bench/results/ops-ce-fwd-h100-2026-11-27/ce_ab2.json), against 256 x 4: 1.02x faster at
    4096 x 32000, 1.03x at 8192 and 16384 x 32000, 1.02x at 4096 x 50257, 1.00x at 4096 x 128256; 512 x 2 ran
    0.85-1.00x (ce_ab.json); 32 x 32 beat 128 x 8 by 1.02-1.04x at 4096 rows but lost 1-2 % at 8192 and 16384, 64 x 16
    lost 0-1.5 % but at 4096 x 128256 (1.006x).
    """
    vec = 16 // itemsize
    cover = max(32, 1 << max(0, (_cdiv(vocab, vec * UNROLL) - 1).bit_length()))  # a row in one trip
    threads = min(FWD_THREADS, props.max_threads_per_block, cover)
    trip = threads * vec * UNROLL  # elements a forward block covers per trip
    resident = props.sm_count * max(1, min(FWD_BLOCKS, props.max_threads_per_sm // threads))
    splits = 1
    if rows < resident:  # one wave at most: rounding up left blocks to a second (H100, bench/results/
        # ops-ce-fwd-h100-2026-11-27/ce_few.json: 512 x 128256 73.0 us at 3 chunks a row, 1.45 waves; 65.5 at 2)
        splits = max(1, min(resident // max(rows, 1), _cdiv(vocab, trip)))
    chunk = _cdiv(_cdiv(vocab, splits), vec) * vec  # whole vectors: the chunks keep the row's alignment
    units = max(1, rows * _cdiv(vocab, chunk))
    fwd = _launch.Plan("cross_entropy_fwd", (min(units, 2**31 - 1),), (threads,), 0, 0)
    finish = _launch.Plan("cross_entropy_finish", (1,), (min(FINISH_THREADS, props.max_threads_per_block),), 0, 0)
    bwd_threads = min(THREADS, props.max_threads_per_block, cover)
    bwd_chunk = BWD_TRIPS * bwd_threads * vec * UNROLL
    bwd_units = max(1, rows * _cdiv(vocab, bwd_chunk))
    bwd = _launch.Plan("cross_entropy_bwd", (min(bwd_units, 2**31 - 1),), (bwd_threads,), 0, 0)
    return CEPlan(fwd, chunk, finish, bwd, bwd_chunk)


def _kernel(name: str, dtype: str, device: int, *template_args: str):
    """cross_entropy_{name}<T, A, *template_args> for ``dtype`` on ``device``."""
    args = "".join(f", {a}" for a in template_args)
    return _sources.kernel(_FILE, f"cross_entropy_{name}<{{T}}, {{A}}{args}>", dtype, device)


def cross_entropy_cuda(logits, target, ignore_index: int = -100, reduction: str = "mean",
                       label_smoothing: float = 0.0, z_loss: float = 0.0):
    """(loss, lse, count) on CUDA: one read of the logits, then one block that reduces."""
    import torch
    mode = check(logits, target, reduction, label_smoothing, z_loss)
    dtype = fn._dtype_name(logits, "cross_entropy")
    logits, target = logits.contiguous(), target.contiguous()
    rows, vocab = logits.shape
    acc = fn._stats_dtype(logits)
    dev, index = logits.device, logits.get_device()
    p = plan(rows, vocab, logits.element_size(), _launch.device_props(index))
    splits = _cdiv(vocab, p.chunk)
    lse = torch.empty(rows, dtype=acc, device=dev)
    row_loss = torch.empty(rows if splits == 1 else 0, dtype=acc, device=dev)
    part = torch.empty(3 * rows * splits if splits > 1 else 0, dtype=acc, device=dev)
    count = torch.empty(1, dtype=acc, device=dev)
    out = torch.empty((rows,) if mode == 0 else (), dtype=logits.dtype, device=dev)
    eps, z = float(label_smoothing), float(z_loss)
    if rows:  # the rows' sums of the logits only for label smoothing (one add an element less without)
        fwd = _kernel("fwd", dtype, index, "true" if eps else "false")
        fwd.launch(_launch.launch_config(p.fwd), logits, target, part, lse, row_loss, rows, vocab, p.chunk,
                   int(ignore_index), eps, z)
    _kernel("finish", dtype, index).launch(_launch.launch_config(p.finish), logits, target, part, lse, row_loss,
                                           out, count, rows, vocab, p.chunk, int(ignore_index), eps, z, mode)
    return out, lse, count


def cross_entropy_backward_cuda(grad, logits, target, lse, count, ignore_index: int = -100,
                                reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0):
    """The logits' gradient on CUDA: one read of the logits, one write of the gradient."""
    import torch
    mode = check(logits, target, reduction, label_smoothing, z_loss)
    dtype = fn._dtype_name(logits, "cross_entropy")
    rows, vocab = logits.shape
    _check_grad(grad, mode, rows)
    logits, target = logits.contiguous(), target.contiguous()
    g = grad.to(logits.dtype).contiguous()
    acc = fn._stats_dtype(logits)
    lse, count = lse.to(acc).contiguous(), count.to(acc).contiguous()
    out = torch.empty_like(logits)
    if rows:
        index = logits.get_device()
        p = plan(rows, vocab, logits.element_size(), _launch.device_props(index))
        _kernel("bwd", dtype, index).launch(_launch.launch_config(p.bwd), logits, target, lse, g, count, out, rows,
                                            vocab, p.bwd_chunk, int(ignore_index), float(label_smoothing),
                                            float(z_loss), mode)
    return out


def _check_grad(grad, mode: int, rows: int) -> None:
    want = (rows,) if mode == 0 else ()
    if tuple(grad.shape) != want and not (mode and grad.numel() == 1):
        raise SpecError(f"{_WHERE}: the loss's gradient has shape {tuple(grad.shape)}, expected {want}")


# -- CPU: the formula in torch, float32 math for 16-bit logits (float64 for float64) ---------------
def _cpu(logits, target, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
         z_loss: float = 0.0):
    import torch
    mode = check(logits, target, reduction, label_smoothing, z_loss)
    x = logits.to(fn._stats_dtype(logits))
    vocab = x.shape[1]
    valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= vocab))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise SpecError(f"{_WHERE}: target[{i}] = {int(target[i])} is not a class index in [0, {vocab}) nor "
                        f"ignore_index ({ignore_index})")
    lse = torch.logsumexp(x, 1)
    safe = torch.where(valid, target, torch.zeros_like(target))
    loss = lse - x.gather(1, safe[:, None])[:, 0]
    if label_smoothing:
        loss = (1 - label_smoothing) * loss + label_smoothing * (lse - x.mean(1))
    if z_loss:
        loss = loss + z_loss * lse * lse
    zero = torch.zeros((), dtype=x.dtype)
    loss, lse = torch.where(valid, loss, zero), torch.where(valid, lse, zero)
    count = valid.sum().to(x.dtype).reshape(1)
    out = loss if mode == 0 else (loss.sum() / count[0] if mode == 2 else loss.sum())
    return out.to(logits.dtype), lse, count


def _cpu_backward(grad, logits, target, lse, count, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, z_loss: float = 0.0):
    import torch
    mode = check(logits, target, reduction, label_smoothing, z_loss)
    rows, vocab = logits.shape
    _check_grad(grad, mode, rows)
    x = logits.to(fn._stats_dtype(logits))
    lse, count = lse.to(x.dtype), count.to(x.dtype)
    valid = target != ignore_index
    p = torch.exp(x - lse[:, None])
    d = p * (1 + 2 * z_loss * lse[:, None]) if z_loss else p
    d = d - label_smoothing / vocab
    safe = torch.where(valid, target, torch.zeros_like(target))
    d = d.scatter_add(1, safe[:, None], torch.full((rows, 1), -(1 - label_smoothing), dtype=x.dtype))
    g = grad.to(x.dtype)
    scale = g[:, None] if mode == 0 else (g.reshape(()) / count[0] if mode == 2 else g.reshape(()))
    d = torch.where(valid[:, None], d * scale, torch.zeros((), dtype=x.dtype))
    return d.to(logits.dtype)


# -- fake kernels: the CUDA implementations' outputs, without data ---------------------------------------
def _fake(logits, target, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
          z_loss: float = 0.0):
    mode = check(logits, target, reduction, label_smoothing, z_loss)
    rows = logits.shape[0]
    acc = fn._stats_dtype(logits)
    return (logits.new_empty((rows,) if mode == 0 else ()), logits.new_empty((rows,), dtype=acc),
            logits.new_empty((1,), dtype=acc))


def _fake_backward(grad, logits, *args, **kwargs):
    return logits.new_empty(logits.shape)


def define_all(define) -> list:
    """Define both operators through ``define(name, schema, cuda, cpu, fake)`` with the forward's
    autograd (the backward an op: the native Autograd kernel serves where it is built); returns
    the ops whose CUDA implementation is registered on every machine."""
    args = 'int ignore_index=-100, str reduction="mean", float label_smoothing=0.0, float z_loss=0.0'
    op = define("cross_entropy", f"(Tensor logits, Tensor target, {args}) -> (Tensor, Tensor, Tensor)",
                cross_entropy_cuda, _cpu, _fake)
    back = define("cross_entropy_backward", f"(Tensor grad, Tensor logits, Tensor target, Tensor lse, "
                  f"Tensor count, {args}) -> Tensor", cross_entropy_backward_cuda, _cpu_backward, _fake_backward)
    op.register_autograd(back, args=("grad0", "logits", "target", "out1", "out2", "ignore_index", "reduction",
                                     "label_smoothing", "z_loss"), grads_for=("logits",))
    return [op, back]
