"""Compile many CUDA programs at once: :func:`compile_many`.

NVRTC is thread-safe and the cache locks per key (``_nvrtc.compile_request``), so programs
compile on a pool of threads; cuda-bindings releases the GIL while NVRTC works. Cached
programs come back without a compile. On a terminal a status line counts the programs done.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from opsmith._build._nvrtc import CompileRequest, CudaBinary, compile_request, make_request
from opsmith._errors import SpecError

__all__ = ["compile_many", "submit_many"]


def _request(job: CompileRequest | Mapping[str, Any], arch: str | None) -> CompileRequest:
    if isinstance(job, CompileRequest):
        return job if arch is None else job._replace(arch=arch)
    if isinstance(job, Mapping):
        kwargs = dict(job)
        if "source" not in kwargs:
            raise SpecError(f"a compile_many job needs a 'source' (CUDA text or a .cu path); got keys {sorted(kwargs)}")
        kwargs.setdefault("arch", arch)
        if kwargs["arch"] is None:
            raise SpecError("compile_many needs a target arch: pass arch='sm_90', or an 'arch' in each job")
        return make_request(kwargs.pop("source"), **kwargs)
    raise SpecError(f"compile_many takes CompileRequests or mappings of compile_cuda arguments "
                    f"({{'source': ..., 'name_expressions': [...]}}), got {type(job).__name__}")


def _workers(max_workers: int | None, count: int) -> int:
    if max_workers is not None:
        if max_workers < 1:
            raise SpecError(f"max_workers must be >= 1, got {max_workers}")
        return min(max_workers, max(1, count))
    from opsmith._config import settings
    return max(1, min(count, settings.max_jobs or os.cpu_count() or 1))


def submit_many(jobs: Iterable[CompileRequest | Mapping[str, Any]], *, arch: str | None = None,
                max_workers: int | None = None) -> list[Future]:
    """Start compiling ``jobs`` on a thread pool; one :class:`~concurrent.futures.Future` per job.

    Each future's ``result()`` is a :class:`~opsmith.CudaBinary` (or raises the job's
    :class:`~opsmith.CompileError`). Arguments as for :func:`compile_many`.
    """
    reqs = [_request(j, arch) for j in jobs]
    pool = ThreadPoolExecutor(max_workers=_workers(max_workers, len(reqs)), thread_name_prefix="opsmith-nvrtc")
    try:
        return [pool.submit(compile_request, r) for r in reqs]
    finally:
        pool.shutdown(wait=False)  # the threads finish the queued jobs, then exit


def compile_many(jobs: Iterable[CompileRequest | Mapping[str, Any]], *, arch: str | None = None,
                 max_workers: int | None = None, progress: bool | None = None,
                 title: str = "compiling CUDA kernels") -> list[CudaBinary]:
    """Compile many CUDA programs with NVRTC at once (or take them from the cache).

    Parameters
    ----------
    jobs : iterable of mappings or CompileRequest
        Each mapping holds :func:`opsmith.compile_cuda`'s arguments: ``source`` (text or a
        ``.cu`` path), and optionally ``name_expressions``, ``defines``, ``arch`` ...
    arch : str, optional
        Target for the jobs that name none (``"sm_90"``).
    max_workers : int, optional
        Threads; default ``MAX_JOBS`` or the number of CPUs.
    progress : bool, optional
        Draw a status line (on a terminal only). Default: on.

    Returns
    -------
    list of CudaBinary
        In the order of ``jobs``. When a job fails, every job still runs to its end and the
        first failure (in job order) is raised.

    Examples
    --------
    >>> bins = opsmith.compile_many([{"source": "a.cu"}, {"source": "b.cu"}], arch="sm_90")  # doctest: +SKIP
    """
    futures = submit_many(jobs, arch=arch, max_workers=max_workers)
    bar = None
    if progress is None or progress:
        from opsmith._build._progress import Progress
        bar = Progress(title)
    try:
        from concurrent.futures import as_completed
        for done, _ in enumerate(as_completed(futures), 1):
            if bar is not None:
                bar.status(f"{done} of {len(futures)} programs")
    finally:
        if bar is not None:
            bar.close()
    return [f.result() for f in futures]
