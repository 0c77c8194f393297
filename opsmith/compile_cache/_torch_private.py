"""Every torch name the compile cache relies on that torch does not promise to keep.

torch gives the compile caches no public backend interface. What it has:

* public, documented ("Compile Time Caching Configuration"): the switches
  ``torch._inductor.config.fx_graph_remote_cache``, ``autotune_remote_cache`` and
  ``torch._functorch.config.enable_remote_autograd_cache`` (``TORCHINDUCTOR_*_REMOTE_CACHE``);
  the counters ``torch._dynamo.utils.counters``;
* private, used here and nowhere else in opsmith:

  - ``torch._inductor.remote_cache``: ``RemoteCacheBackend`` (``_get``/``_put`` of bytes) and
    the ``backend_override_cls`` class attribute of the cache classes inductor creates
    (``RemoteFxGraphCache``, ``RemoteAOTAutogradCache``, ``RemoteAutotuneCache``), which
    torch's own tests use to swap the Redis backend for another;
  - ``torch._inductor.codecache._worker_compile_cpp(lock_path, cpp_builders)``: where every
    C++ kernel (and precompiled header) of inductor's CPU code cache is compiled; its
    builders' ``get_command_line()`` and ``get_target_file_path()``;
  - ``torch._inductor.cpu_vec_isa.VecISA.check_build`` and ``CppBuilder.build``: inductor's
    probes of the CPU's vector ISAs compile a small library each (seconds on a new machine);
    builds inside a probe go through opsmith's store too (the probe still loads it here);
  - ``torch._inductor.compile_fx.fx_codegen_and_compile``: inductor's compile of one FX graph,
    called only on a cache miss (or bypass), for must-hit mode and for releasing a lease;
  - ``torch._dynamo.callback.on_compile_end``: runs when a compile (or a lazy backward
    compile) ends.

:func:`problems` and :func:`probe_hook_problems` check all of them (tests/compile_cache/test_compile_cache.py
fails loudly when a torch release renames or reshapes one; without the probe hook the cache
still works, the probes compile on each machine); :func:`install` and :func:`uninstall` are the only code
that writes into torch.
"""
from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "CACHE_CLASSES",
    "RemoteCacheBackend",
    "counters",
    "install",
    "installed",
    "probe_hook_problems",
    "problems",
    "torch_identity",
    "uninstall",
]

log = logging.getLogger("opsmith.compile_cache")

# inductor's cache class -> what it holds (the entries' names in opsmith's cache)
CACHE_CLASSES = {
    "RemoteFxGraphCache": "fx-graph",
    "RemoteAOTAutogradCache": "aot-autograd",
    "RemoteAutotuneCache": "autotune",
}
# switches turned on while installed: (module, attribute)
_SWITCHES = (
    ("torch._inductor.config", "fx_graph_remote_cache"),
    ("torch._inductor.config", "autotune_remote_cache"),
    ("torch._functorch.config", "enable_remote_autograd_cache"),
)

from torch._inductor.remote_cache import RemoteCacheBackend

_saved: dict[tuple[str, str], Any] = {}
_callbacks: list[Callable] = []


def _module(name: str):
    import importlib
    return importlib.import_module(name)


def counters() -> dict[str, dict[str, int]]:
    """torch's compile counters (``torch._dynamo.utils.counters``) as plain dicts."""
    from torch._dynamo.utils import counters as c
    return {k: dict(v) for k, v in c.items()}


def torch_identity() -> tuple[str, str]:
    """torch's version and git revision (part of every key opsmith adds)."""
    import torch
    return torch.__version__, str(getattr(torch.version, "git_version", "") or "")


def installed() -> bool:
    return bool(_hooked)


def install(backend_for: Callable[[str], Callable[[], Any]], compile_cpp: Callable,
            compile_graph: Callable, on_compile_end: Callable[[], None],
            build_probe: Callable | None = None) -> None:
    """Point inductor's caches at opsmith.

    ``backend_for(artifact)`` returns what torch calls with no argument to make a backend;
    ``compile_cpp(original, lock_path, builders)`` replaces ``_worker_compile_cpp``;
    ``build_probe(original_build, builder)`` runs the builds of inductor's ISA probes;
    ``compile_graph(original, *args, **kwargs)`` wraps ``fx_codegen_and_compile``;
    ``on_compile_end()`` runs at the end of each compile.
    """
    if _hooked:
        return
    install_backends(backend_for)
    _hooked.append(True)
    for mod, attr in _SWITCHES:
        m = _module(mod)
        _saved[(mod, attr)] = getattr(m, attr)
        setattr(m, attr, True)
    cc = _module("torch._inductor.codecache")
    original_cpp = cc._worker_compile_cpp
    _saved[("torch._inductor.codecache", "_worker_compile_cpp")] = original_cpp

    def _worker_compile_cpp(lock_path, cpp_builders):
        return compile_cpp(original_cpp, lock_path, cpp_builders)
    cc._worker_compile_cpp = _worker_compile_cpp
    if build_probe is not None:
        _install_probe_hook(build_probe)
    cf = _module("torch._inductor.compile_fx")
    original_fx = cf.fx_codegen_and_compile
    _saved[("torch._inductor.compile_fx", "fx_codegen_and_compile")] = original_fx

    def fx_codegen_and_compile(*args, **kwargs):
        return compile_graph(original_fx, *args, **kwargs)
    cf.fx_codegen_and_compile = fx_codegen_and_compile
    from torch._dynamo import callback
    cb = callback.on_compile_end(lambda *args: on_compile_end())
    _callbacks.append(cb)


_probing = threading.local()
_hooked: list[bool] = []


def install_backends(backend_for: Callable[[str], Callable[[], Any]]) -> None:
    """Only the backends of inductor's cache classes (what a compile worker process needs: it
    reads autotuning results, and must never fall back on torch's own, unsigned Redis backend)."""
    rc = _module("torch._inductor.remote_cache")
    for cls_name, artifact in CACHE_CLASSES.items():
        key = (f"torch._inductor.remote_cache.{cls_name}", "backend_override_cls")
        if key in _saved:
            continue
        cls = getattr(rc, cls_name)
        _saved[key] = cls.backend_override_cls
        cls.backend_override_cls = backend_for(artifact)


def _install_probe_hook(build_probe: Callable) -> None:
    isa = _module("torch._inductor.cpu_vec_isa")
    cb = _module("torch._inductor.cpp_builder")
    original_check = isa.VecISA.check_build
    original_build = cb.CppBuilder.build
    _saved[("torch._inductor.cpu_vec_isa:VecISA", "check_build")] = original_check
    _saved[("torch._inductor.cpp_builder:CppBuilder", "build")] = original_build

    def check_build(self, code):
        _probing.on = True
        try:
            return original_check(self, code)
        finally:
            _probing.on = False

    def build(self):
        if getattr(_probing, "on", False):
            return build_probe(original_build, self)
        return original_build(self)
    isa.VecISA.check_build = check_build
    cb.CppBuilder.build = build


def uninstall() -> None:
    """Put back everything :func:`install` changed."""
    rc = _module("torch._inductor.remote_cache")
    for (where, attr), value in list(_saved.items()):
        if attr == "backend_override_cls":
            setattr(getattr(rc, where.rpartition(".")[2]), attr, value)
        elif ":" in where:  # a method of a class
            mod, _, cls = where.partition(":")
            setattr(getattr(_module(mod), cls), attr, value)
        else:
            setattr(_module(where), attr, value)
    _saved.clear()
    _hooked.clear()
    from torch._dynamo.callback import callback_handler
    while _callbacks:
        cb = _callbacks.pop()
        try:
            callback_handler.remove_end_callback(cb)
        except ValueError:
            pass


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def probe_hook_problems() -> list[str]:
    """What this torch lacks for caching the ISA probes' libraries (optional: without it the
    probes compile on each machine, as without opsmith)."""
    out: list[str] = []
    try:
        isa = _module("torch._inductor.cpu_vec_isa")
        ok = (_params(isa.VecISA.check_build) == ["self", "code"]
              and ".build()" in inspect.getsource(isa.VecISA.check_build)
              and _params(_module("torch._inductor.cpp_builder").CppBuilder.build) == ["self"])
    except Exception as exc:
        ok, out = False, [f"({type(exc).__name__}: {exc})"]
    if not ok:
        out.insert(0, "torch._inductor.cpu_vec_isa.VecISA.check_build(code), calling CppBuilder.build()")
    return out


def problems() -> list[str]:
    """What this torch lacks of the names above that the compile cache cannot do without
    (empty when every one is as expected); see also :func:`probe_hook_problems`."""
    out: list[str] = []

    def need(what: str, ok: Callable[[], bool]) -> None:
        try:
            if not ok():
                out.append(what)
        except Exception as exc:  # an import or attribute error is the finding
            out.append(f"{what} ({type(exc).__name__}: {exc})")

    rc = "torch._inductor.remote_cache"
    need(f"{rc}.RemoteCacheBackend with _get(key) and _put(key, data)",
         lambda: _params(RemoteCacheBackend._get)[1:] == ["key"]
         and _params(RemoteCacheBackend._put)[1:] == ["key", "data"])
    for cls_name in CACHE_CLASSES:
        need(f"{rc}.{cls_name}.backend_override_cls",
             lambda c=cls_name: hasattr(getattr(_module(rc), c), "backend_override_cls"))
    need(f"{rc}.RemoteCache.__init__ calls backend_override_cls()",
         lambda: "backend_override_cls" in inspect.getsource(_module(rc).RemoteCache.__init__))
    for mod, attr in _SWITCHES:
        need(f"{mod}.{attr}", lambda m=mod, a=attr: hasattr(_module(m), a))
    need("torch._inductor.codecache._worker_compile_cpp(lock_path, cpp_builders)",
         lambda: _params(_module("torch._inductor.codecache")._worker_compile_cpp) == ["lock_path", "cpp_builders"])
    need("torch._inductor.cpp_builder.CppBuilder.get_command_line() and get_target_file_path()",
         lambda: all(callable(getattr(_module("torch._inductor.cpp_builder").CppBuilder, m, None))
                     for m in ("get_command_line", "get_target_file_path")))
    need("torch._inductor.compile_fx.fx_codegen_and_compile(gm, example_inputs, ...)",
         lambda: _params(_module("torch._inductor.compile_fx").fx_codegen_and_compile)[:2] == ["gm", "example_inputs"])
    need("torch._inductor.compile_fx calls fx_codegen_and_compile by its module-level name",
         lambda: "fx_codegen_and_compile(" in inspect.getsource(_module("torch._inductor.compile_fx")._compile_fx_inner))
    need("torch._dynamo.callback.on_compile_end and callback_handler.remove_end_callback",
         lambda: callable(_module("torch._dynamo.callback").on_compile_end)
         and callable(_module("torch._dynamo.callback").callback_handler.remove_end_callback))
    need("torch._dynamo.utils.counters", lambda: hasattr(_module("torch._dynamo.utils"), "counters"))
    return out
