"""Time a CUDA op or kernel the way a memory-bound op should be timed: :func:`benchmark`.

CUDA events around each call, with the GPU kept busy (a spin kernel) while the host enqueues
the call so that the host's launch latency does not count (GPU time of the op's kernels), the
median of many runs, the L2 cache flushed between runs (a write over a buffer twice its size) so that every
run reads from DRAM as a cold op in a model would, and the result as GB/s against the
device's *measured* device-to-device copy bandwidth (:func:`copy_bandwidth`), the practical
roofline of an op that reads and writes each byte once.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from opsmith._errors import SpecError
from opsmith._record import Record

__all__ = ["BenchResult", "benchmark", "copy_bandwidth"]

_copy_cache: dict[int, float] = {}


class BenchResult(Record):
    """Timings of one op: ``median_ms``, ``min_ms``, ``runs``, ``bytes_moved``, ``gbps`` (bytes
    moved per second of the median, in 1e9), ``copy_gbps`` (the device's measured copy
    bandwidth) and ``fraction`` (``gbps / copy_gbps``); the GB/s fields are None without
    ``bytes_moved``."""

    __slots__ = ("median_ms", "min_ms", "runs", "bytes_moved", "gbps", "copy_gbps", "fraction")  # noqa: RUF023

    def __str__(self) -> str:
        if self.gbps is None:
            return f"{self.median_ms * 1e3:.1f} us (median of {self.runs})"
        return (f"{self.median_ms * 1e3:.1f} us, {self.gbps:.0f} GB/s = {self.fraction:.1%} of copy "
                f"({self.copy_gbps:.0f} GB/s; median of {self.runs})")


def _index(device) -> int:
    """A CUDA device index from None (the current device), an int, "cuda:1" or a torch.device."""
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def _l2_flusher(device):
    import torch
    props = torch.cuda.get_device_properties(device)
    size = max(2 * int(getattr(props, "L2_cache_size", 0) or 0), 64 << 20)
    buf = torch.empty(size // 4, dtype=torch.int32, device=device)
    return lambda: buf.zero_()


_cycles_per_ms: dict[int, float] = {}


def _spin_rate(device: int) -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep`` (measured once per device)."""
    import torch
    rate = _cycles_per_ms.get(device)
    if rate is None:
        cycles = 1 << 21
        torch.cuda._sleep(cycles)  # clocks up
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        torch.cuda.synchronize(device)
        rate = _cycles_per_ms[device] = cycles / max(s.elapsed_time(e), 1e-3)
    return rate


def _times(fn: Callable[[], Any], runs: int, warmup: int, flush, device) -> list[float]:
    import time

    import torch
    with torch.cuda.device(device):
        hosts = []
        for _ in range(max(warmup, 2)):
            t = time.perf_counter()
            fn()
            hosts.append(time.perf_counter() - t)
        # The first call may compile (seconds): the host time of a call is the slowest of the
        # later ones, and never more than 20 ms (a host that slow is what is being timed).
        host = min(max(hosts[1:]), 0.02)
        # The GPU must not wait for the host between the start event and the op's kernels,
        # or the time is the host's launch latency (a Python op's dispatch, autograd.grad):
        # a spin kernel after the flush keeps the GPU busy while the host enqueues the start
        # event, the op and the end event (twice a warm call's host time, plus 50 us).
        spin = 0
        if flush is not None and hasattr(torch.cuda, "_sleep"):
            spin = int(_spin_rate(device) * (2 * host * 1e3 + 0.05))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        for s, e in zip(starts, ends):
            if flush is not None:
                flush()
            if spin:
                torch.cuda._sleep(spin)
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def copy_bandwidth(device=None, *, nbytes: int = 1 << 30, runs: int = 30) -> float:
    """The device's device-to-device copy bandwidth in GB/s (read + write bytes, 1e9), measured
    with ``dst.copy_(src)`` over ``nbytes`` once per device and process."""
    import torch
    idx = _index(device)
    bw = _copy_cache.get(idx)
    if bw is None:
        free = torch.cuda.mem_get_info(idx)[0]
        nbytes = max(1 << 20, min(nbytes, free // 4))
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=idx)
        dst = torch.empty_like(src)
        ms = statistics.median(_times(lambda: dst.copy_(src), runs, 3, None, idx))
        bw = _copy_cache[idx] = 2 * src.numel() * 4 / (ms * 1e-3) / 1e9
        del src, dst
    return bw


def benchmark(fn: Callable[..., Any], *args: Any, bytes_moved: int | None = None, runs: int = 100,
              warmup: int = 10, flush_l2: bool = True, device=None, **kwargs: Any) -> BenchResult:
    """Time ``fn(*args, **kwargs)`` on a CUDA device with events; median of ``runs``.

    Parameters
    ----------
    fn : callable
        An op, a module, a lambda that launches a kernel ...
    bytes_moved : int, optional
        The bytes the op must read and write at least (``2 * x.nbytes`` for an elementwise
        op); gives ``gbps`` and ``fraction`` of the measured copy bandwidth.
    runs, warmup : int
        Timed and untimed calls.
    flush_l2 : bool
        Write over a buffer twice the L2 size before each timed call (not timed), so that
        inputs come from DRAM. Turn off to time an op whose inputs a model keeps in L2.
    device : int, optional
        Default: the device of the first tensor argument, else the current device.

    Returns
    -------
    BenchResult

    Examples
    --------
    >>> x = torch.randn(1 << 26, device="cuda")                                    # doctest: +SKIP
    >>> print(opsmith.ops.benchmark(opsmith.ops.relu, x, bytes_moved=2 * x.nbytes))  # doctest: +SKIP
    270.6 us, 1984 GB/s = 98.9% of copy (2006 GB/s; median of 100)
    """
    import torch
    if runs < 1:
        raise SpecError(f"benchmark needs runs >= 1, got {runs}")
    if not torch.cuda.is_available():
        raise SpecError("opsmith.ops.benchmark times CUDA work and torch sees no CUDA device")
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    device = _index(device)
    flush = _l2_flusher(device) if flush_l2 else None
    times = _times(lambda: fn(*args, **kwargs), runs, warmup, flush, device)
    med = statistics.median(times)
    gbps = copy = frac = None
    if bytes_moved is not None:
        gbps = bytes_moved / (med * 1e-3) / 1e9
        copy = copy_bandwidth(device)
        frac = gbps / copy
    return BenchResult(median_ms=med, min_ms=min(times), runs=runs, bytes_moved=bytes_moved, gbps=gbps,
                       copy_gbps=copy, fraction=frac)
