"""What opsmith's torch C++ libraries (the native Autograd kernels, opsmith.ops' CUDA kernels)
share: whether one is usable here, decided once per process."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["mark_built", "usable"]

log = logging.getLogger("opsmith")


def _marker(name: str):
    """A file in the cache that says library ``name`` was built there for this torch and opsmith."""
    import sys

    from opsmith._config import settings
    from opsmith._version import __version__
    torch_version = getattr(sys.modules.get("torch"), "__version__", "none")
    return settings.cache_path / "native-built" / f"{name}-{torch_version}-{__version__}"


def mark_built(name: str) -> None:
    """Note that library ``name`` is in the cache (its build() calls this after a build or a hit)."""
    path = _marker(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:  # a read-only cache: the next package process pays a full lookup, nothing worse
        pass


def usable(state: dict[str, Any], enabled: bool, load: Callable[[], Any], what: str, fallback: str,
           variable: str, name: str) -> bool:
    """True when the library is ``enabled`` and ``load()`` builds and opens it. A failure (no
    compiler, a torch without headers) is logged once, naming ``fallback`` and the ``variable``
    that turns the library off, and remembered in ``state``: the fallback serves from then on.

    In a process that uses an installed opsmith package (:mod:`opsmith._build._prebuilt`) the
    library is only taken from the cache, never built: a package runs with no compile, and the
    fallback serves where the library is not there (``opsmith warm --ops`` puts it there). There,
    a cache where ``name`` was never built (no :func:`mark_built` file, one ``stat``) is a miss
    without the build engine's lookup, which cost a quarter of a package's import (4 of 19 ms)."""
    if not enabled or "failed" in state:
        return False
    from opsmith._build import _prebuilt
    from opsmith._config import settings
    packaged = _prebuilt.active()  # an installed opsmith package serves: it promises no compile
    if packaged and not _marker(name).exists():
        state["failed"] = "not built in this cache"
        log.info("opsmith: %s not in the cache and not built (an opsmith package is installed: no compiles); "
                 "%s", what, fallback)
        return False
    try:
        with settings.override(must_hit=True) if packaged else contextlib.nullcontext():
            load()
        return True
    except Exception as exc:  # noqa: BLE001  (any failure: the fallback serves, said once)
        state["failed"] = exc
        if packaged:  # not in the cache: not built, as promised (opsmith warm --ops builds it)
            log.info("opsmith: %s not in the cache and not built (an opsmith package is installed: no compiles); "
                     "%s", what, fallback)
        else:
            log.warning("opsmith: %s unavailable (%s); %s (set %s=0 to silence this)", what,
                        str(exc).splitlines()[0], fallback, variable)
        return False
