"""The diag scripts' timing of one kernel launch (or a few): CUDA events around ``fn``, the L2
flushed before each run (a 256 MiB buffer zeroed), the median of ``runs`` after two warm-ups, in
microseconds. Unlike :func:`opsmith.ops.benchmark` there is no spin kernel ahead of the launch:
the host's launch latency is inside the events, which these scripts' comparisons share. Also what
several of them share around it: a same-size copy's GB/s, their ``--json`` file, the folder their extra kernels
compile in and the stand-in for ``_sources.kernel`` that takes a file's kernels from a variant's module."""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

_flush: list = []


def flush_l2() -> None:
    """Evict the L2 cache by writing a buffer of 256 MiB (allocated once)."""
    if not _flush:
        _flush.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
    _flush[0].zero_()


def median_us(fn, runs: int) -> float:
    """Median microseconds of ``fn()`` over ``runs`` runs, each after an L2 flush."""
    out = []
    for _ in range(runs + 2):
        flush_l2()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out[2:])


def per_kernel(fn, n: int = 20, flush: bool = False) -> dict:
    """{kernel name: us a call} of ``fn()`` over ``n`` calls (torch.profiler), after 3 warm-ups; ``flush``: the L2
    flushed before each call (:func:`flush_l2`, whose kernel is left out)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        if flush:
            flush_l2()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            if flush:
                flush_l2()
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not (flush and "fill" in e.name.lower()):
            k = e.name.split("<")[0].split("(")[0].replace("void ", "")[-40:]
            out[k] = out.get(k, 0.0) + e.device_time / n
    return out


def copy_gbps(nbytes: int) -> float:
    """GB/s of a device copy of ``nbytes`` (2 * nbytes moved) timed as :func:`opsmith.ops.benchmark` times
    the ops: what a forward that reads and writes as many bytes can reach."""
    from opsmith import ops
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return ops.benchmark(lambda: dst.copy_(src), bytes_moved=2 * nbytes).gbps


def write_records(path, records: list) -> None:
    """A diag script's ``--json``: the device, torch's version and its records."""
    if path:
        with open(path, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, fh,
                      indent=1)


def beside_kernels(name: str, source: str) -> Path:
    """``source`` written as ``name`` into a new folder holding a copy of opsmith.ops' kernel files, so that its
    ``#include "norm_fwd.cuh"`` finds them as shipped: a diag script's extra kernels. Returns the file's path."""
    from opsmith.ops import _sources
    tmp = Path(tempfile.mkdtemp())
    for f in _sources.KERNEL_DIR.iterdir():
        shutil.copy(f, tmp / f.name)
    (tmp / name).write_text(source)
    return tmp / name


def kernel_from(module, file: str, original):
    """A stand-in for ``opsmith.ops._sources.kernel`` (``original``) that takes ``file``'s kernels from ``module`` (a
    CudaModule of that file compiled with a variant's defines; None: the shipped ones) and every other file's from
    ``original``."""
    from opsmith.ops import _sources

    def kernel(f, expr, dt, device):
        if f != file or module is None:
            return original(f, expr, dt, device)
        t, a = _sources.DTYPES[dt]
        return module.get_kernel(expr.format(T=t, A=a))
    return kernel
