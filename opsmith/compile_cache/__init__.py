"""``torch.compile``'s caches through opsmith's cache: signed, shared, leased, counted.

With the compile cache enabled, inductor's FX graph cache, its AOTAutograd cache, its
autotuning results and its compiled C++ kernels (CPU) are read from and written to opsmith's
store: the local cache directory, then the shared Redis tier when ``OPSMITH_REMOTE_CACHE`` is
set (entries signed and verified as every opsmith entry), with ``OPSMITH_MUST_HIT=1``
(a compile becomes a :class:`~opsmith.CacheError` naming the graph), ``opsmith cache stats``
and ``opsmith cache export``/``import``. When several processes miss the same graph at once,
one compiles and the others wait for its entry (``OPSMITH_COMPILE_CACHE_WAIT``). Triton
kernels travel inside inductor's FX graph entries (torch bundles them there).

Turn it on in code with :func:`enable`, or for every process of a launcher with
``OPSMITH_COMPILE_CACHE=1`` (torch >= 2.5 runs opsmith's hook when torch is imported; nothing
of inductor is imported until the first compile). See docs/compile_cache.md.

Examples
--------
>>> import opsmith.compile_cache, torch                                   # doctest: +SKIP
>>> opsmith.compile_cache.enable()                                       # doctest: +SKIP
>>> model = torch.compile(torch.nn.Linear(8, 8))                         # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
import threading

__all__ = ["disable", "enable", "is_enabled", "stats"]

log = logging.getLogger("opsmith.compile_cache")

_state: dict[str, object] = {}
_mutex = threading.RLock()  # enable() may import the module whose import hook calls enable_backends()


def enable(cache_dir: str | os.PathLike | None = None) -> None:
    """Send ``torch.compile``'s caches through opsmith's cache (at ``cache_dir``, default the
    opsmith cache directory) from the next compile on. Calling it again does nothing.

    It also sets ``OPSMITH_COMPILE_CACHE=1`` in ``os.environ`` (until :func:`disable`), so that
    inductor's compile worker processes started later use opsmith's backends too.

    Raises
    ------
    opsmith.ConfigError
        When this torch lacks a hook the compile cache needs (the message names it).
    """
    from opsmith._errors import ConfigError
    with _mutex:
        if _state.get("enabled"):
            return
        from opsmith.compile_cache import _torch_private as tp
        missing = tp.problems()
        if missing:
            import torch
            raise ConfigError(f"opsmith's compile cache cannot hook into torch {torch.__version__}: it "
                              f"lacks {'; '.join(missing)}. Use a torch version listed in "
                              f"docs/compile_cache.md, or unset OPSMITH_COMPILE_CACHE.")
        from opsmith.compile_cache._kernels import KernelCache
        owner = _owner(cache_dir)
        kernels = KernelCache(owner)
        probe_missing = tp.probe_hook_problems()
        if probe_missing:
            log.warning("opsmith's compile cache does not cache inductor's ISA-probe libraries with this "
                        "torch (it lacks %s); they compile on each machine", "; ".join(probe_missing))
        tp.install(owner.backend_for, kernels.compile, _compile_graph(owner), owner.leases.release_thread,
                   None if probe_missing else kernels.build_probe)
        # inductor's compile worker processes read autotuning results: they inherit this and
        # point their cache backends at opsmith too (opsmith.compile_cache._autoload)
        _state.update(kernels=kernels, enabled=True, env=os.environ.get("OPSMITH_COMPILE_CACHE"))
        os.environ["OPSMITH_COMPILE_CACHE"] = "1"
    log.info("torch.compile's caches go through opsmith's cache at %s", owner.cache.root)


def _owner(cache_dir: str | os.PathLike | None = None):
    """The process's :class:`~._backend.CompileCache` (made once; the caller holds ``_mutex``)."""
    owner = _state.get("owner")
    if owner is not None and cache_dir is not None and \
            os.path.abspath(os.fspath(cache_dir)) != os.fspath(owner.cache.root):
        from opsmith._errors import ConfigError
        raise ConfigError(f"opsmith's compile cache already uses {owner.cache.root} in this process; call "
                          f"opsmith.compile_cache.disable() before enabling it on {cache_dir}")
    if owner is None:
        import atexit

        from opsmith._cache._open import open_cache
        from opsmith._config import settings
        from opsmith.compile_cache._backend import CompileCache
        owner = _state["owner"] = CompileCache(open_cache(cache_dir), settings.compile_cache_wait)
        atexit.register(owner.leases.release_all)
    return owner


def enable_backends() -> None:
    """Only inductor's cache backends (a compile worker process: it never compiles a graph)."""
    with _mutex:
        from opsmith.compile_cache import _torch_private as tp
        tp.install_backends(_owner().backend_for)


def disable() -> None:
    """Give torch's caches back to torch (what :func:`enable` changed is restored)."""
    with _mutex:
        owner = _state.pop("owner", None)
        if _state.get("enabled"):
            if _state.get("env") is None:
                os.environ.pop("OPSMITH_COMPILE_CACHE", None)
            else:
                os.environ["OPSMITH_COMPILE_CACHE"] = _state["env"]
        _state.clear()
        if owner is None:
            return
        from opsmith.compile_cache import _torch_private as tp
        from opsmith.compile_cache import _triton_stubs
        tp.uninstall()
        _triton_stubs.uninstall()
        owner.leases.release_all()
        owner.counters.flush()


def is_enabled() -> bool:
    """True between :func:`enable` and :func:`disable`."""
    return bool(_state.get("enabled"))


def stats() -> dict[str, dict[str, float]]:
    """This process's counts per artifact (hits, misses, puts, waited, compiles) so far
    (including those already added to the cache's ``compile-stats.json``)."""
    owner = _state.get("owner")
    return {} if owner is None else owner.counters.totals()


def _compile_graph(owner):
    """Wraps inductor's compile of one FX graph: must-hit, and the lease on failure."""
    def compile_graph(original, *args, **kwargs):
        from opsmith._config import settings
        miss = owner.last_graph_miss()
        owner.forget_graph_miss()
        try:
            if settings.must_hit:
                from opsmith._cache._tiered import check_must_hit
                if miss is not None:
                    check_must_hit(miss[0], f"torch.compile would compile the FX graph {miss[1]}")
                check_must_hit("(none)", "torch.compile would compile an FX graph that inductor does not "
                               "cache", "inductor bypassed its cache for this graph, so it has no key")
            result = original(*args, **kwargs)
        except BaseException:
            if miss is not None:
                owner.leases.release(miss[0])
            raise
        owner.counters.add("fx-graph", "compiles")
        return result
    return compile_graph
