"""Compile these CUDA sources for these archs, cached: one NVRTC compile per (source, arch).

What a library that embeds code for several GPUs needs (export-c, the ONNX Runtime library):
the archs to build for (the common ones the installed NVRTC supports, or the caller's, checked
against it, plus PTX of the newest for newer GPUs), and every (source, arch) compiled through
the store, the misses in parallel worker processes.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable

from opsmith._errors import SpecError, ToolchainError
from opsmith._runtime._launch_gen import arch_number

__all__ = ["COMMON_ARCHS", "default_archs", "resolve_archs", "compile_all", "supported_archs"]

#: The common datacenter and consumer GPUs: T4, A100, RTX 30xx/A10, L4/RTX 40xx, H100, B200,
#: RTX 50xx. :func:`default_archs` keeps those the installed NVRTC supports.
COMMON_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")


def supported_archs() -> list[int]:
    """The ``sm_XY`` numbers the installed NVRTC compiles for (``[75, 80, ...]``)."""
    from opsmith._build import _nvrtc
    nvrtc = _nvrtc._nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError("NVRTC could not list the archs it supports (nvrtcGetSupportedArchs failed)")
    return sorted(int(a) for a in archs)


def default_archs() -> tuple[str, ...]:
    """The default targets: :data:`COMMON_ARCHS` that the installed NVRTC supports.

    Examples
    --------
    >>> default_archs()  # doctest: +SKIP
    ('sm_75', 'sm_80', 'sm_86', 'sm_89', 'sm_90', 'sm_100', 'sm_120')
    """
    supported = set(supported_archs())
    return tuple(a for a in COMMON_ARCHS if arch_number(a) in supported)


def resolve_archs(archs: Iterable[str | int] | None, ptx: bool) -> list[tuple[str, str]]:
    """[(arch, "cubin" | "ptx")]: the cubins, then the PTX of the newest when ``ptx``.

    ``archs`` is a list (``["sm_80", 90]``), a string (``"sm_80,sm_90"``) or None for
    :func:`default_archs`; an arch the installed NVRTC cannot compile for is refused, naming
    those it can.
    """
    from opsmith._build._nvrtc import normalize_arch
    if archs is None:
        chosen = list(default_archs())
        if not chosen:
            raise ToolchainError(f"the installed NVRTC supports none of {', '.join(COMMON_ARCHS)}; "
                                 f"pass the archs to build for (archs=['sm_90'] or --arch sm_90)")
    else:
        if isinstance(archs, (str, int)):
            archs = [a for a in str(archs).replace(",", " ").split() if a]
        chosen = list(dict.fromkeys(normalize_arch(a) for a in archs))
        if not chosen:
            raise SpecError("archs is empty: name at least one, e.g. ['sm_90'], or leave it out for the "
                            "default list")
        supported = supported_archs()
        bad = [a for a in chosen if arch_number(a) not in supported]
        if bad:
            raise SpecError(f"the installed NVRTC cannot compile for {', '.join(bad)}; it supports "
                            f"{', '.join(f'sm_{a}' for a in supported)}. Pick from those, or install a "
                            f"newer NVRTC (pip install -U nvidia-cuda-nvrtc) for newer GPUs.")
    chosen.sort(key=lambda a: (arch_number(a), a))
    out = [(a, "cubin") for a in chosen]
    if ptx:
        newest = max(chosen, key=arch_number)
        out.append((re.sub(r"[af]$", "", newest), "ptx"))  # arch-specific PTX would run on one chip only
    return out


_WORKER = ("import pickle, sys\n"
           "from opsmith._build._nvrtc import compile_request\n"
           "for r in pickle.load(sys.stdin.buffer):\n"
           "    try:\n"
           "        compile_request(r)\n"
           "    except Exception:\n"
           "        pass  # the parent compiles it again and reports the error\n")


def compile_all(requests) -> list:
    """A :class:`~opsmith.CudaBinary` per NVRTC request, from the store or NVRTC, in order.

    The first request shows whether this set is cold: when NVRTC had to compile it, worker
    processes compile the others into the store (NVRTC calls in one process are serialised),
    and this process then reads them from there. The workers are plain ``python -c``
    processes, not multiprocessing's, which would run the caller's ``__main__`` again.
    """
    import pickle
    import sys

    from opsmith._build._nvrtc import compile_request
    from opsmith._toolchain._cxx import max_jobs
    first = compile_request(requests[0])
    rest = list(requests[1:])
    jobs = min(max_jobs(per_job_bytes=1 << 29), len(rest))
    if not first.from_cache and jobs > 1:
        procs = []
        for j in range(jobs):
            proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append((proc, pickle.dumps(rest[j::jobs])))
        for proc, data in procs:
            proc.communicate(data)
    return [first, *(compile_request(r) for r in rest)]
