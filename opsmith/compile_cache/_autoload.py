"""``OPSMITH_COMPILE_CACHE=1`` with no code change: a hook that torch runs when it is imported.

torch (>= 2.5) calls every entry point of the group ``torch.backends`` at the end of
``import torch`` (its documented autoload of out-of-tree extensions; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns it off). opsmith declares :func:`autoload` there (pyproject.toml). It reads one setting
and, when the compile cache is asked for, arranges for :func:`opsmith.compile_cache.enable`
to run right after ``torch._inductor.compile_fx`` is first imported, which is the first
``torch.compile`` that reaches inductor: a process that imports torch and never compiles
imports nothing more (inductor's modules cost ~2 s to import). Right after
``torch._inductor.remote_cache`` is imported (before, in the same compile), the cache classes'
backends are pointed at opsmith: that is all a compile worker process needs.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys

__all__ = ["after_import", "autoload"]

log = logging.getLogger("opsmith.compile_cache")

TRIGGER = "torch._inductor.compile_fx"
BACKENDS = "torch._inductor.remote_cache"


def autoload() -> None:
    """torch's entry point: enable the compile cache at the first compile when asked to."""
    from opsmith._config import settings
    from opsmith._errors import ConfigError
    try:
        wanted = settings.compile_cache
    except ConfigError as exc:  # never break `import torch` over a setting: say so instead
        log.warning("%s; opsmith's compile cache stays off", exc)
        return
    if wanted:
        after_import(BACKENDS, _enable_backends)
        after_import(TRIGGER, _enable)


def _enable() -> None:
    from opsmith import compile_cache
    compile_cache.enable()


def _enable_backends() -> None:
    """inductor's cache classes point at opsmith as soon as they exist: in a compile worker
    process (which reads autotuning results and never imports compile_fx) too, so that no
    process of the job falls back on torch's own Redis backend (unsigned, localhost:6379)."""
    try:
        from opsmith import compile_cache
        compile_cache.enable_backends()
    except Exception as exc:  # never break an import of torch's: the parent process still checks
        log.warning("opsmith's compile cache could not point inductor's cache backends at opsmith "
                    "here (%s: %s)", type(exc).__name__, exc)


class _Loader(importlib.abc.Loader):
    """A module's own loader, then ``then()`` once the module has run."""

    def __init__(self, inner, then) -> None:
        self.inner, self.then = inner, then

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.then()


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then) -> None:
        self.name, self.then, self._busy = name, then, False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        with_hook = self

        def then() -> None:
            if with_hook in sys.meta_path:
                sys.meta_path.remove(with_hook)
            self.then()
        spec.loader = _Loader(spec.loader, then)
        return spec


def after_import(name: str, then) -> None:
    """Run ``then()`` right after module ``name`` is first imported (now, if it already is)."""
    if name in sys.modules:
        then()
        return
    sys.meta_path.insert(0, _AfterImport(name, then))
