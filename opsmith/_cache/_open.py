"""Opening a cache root: the :class:`Cache` (store, locks, state, workspace) per root and backend.

The backend is chosen by ``settings.store_backend`` (``"local"`` or ``"module:Class"``); with
``OPSMITH_REMOTE_CACHE`` set the store is wrapped in the shared tier (:mod:`._tiered`). This is
the one module that knows every backend; the :class:`~opsmith._cache._store.Store` interface
knows none of them.
"""
from __future__ import annotations

import os
from pathlib import Path

from opsmith._cache._store import Store
from opsmith._config import on_reset
from opsmith._errors import ConfigError

__all__ = ["Cache", "open_store", "open_cache", "reset"]


class Cache:
    """The objects over one cache root: ``store``, ``locks``, ``state`` and ``workspace``.

    ``locks``, ``state`` and ``workspace`` are made on first use: a warm load asks only the
    store to count a hit, and imports none of their modules.
    """

    __slots__ = ("root", "store", "_locks", "_state", "_workspace")

    def __init__(self, root: Path, store: Store) -> None:
        self.root, self.store = root, store
        self._locks = self._state = self._workspace = None

    @property
    def locks(self):
        if self._locks is None:
            from opsmith._cache._locks import Locks
            self._locks = Locks(self.root)
        return self._locks

    @property
    def state(self):
        if self._state is None:
            from opsmith._cache._state import State
            self._state = State(self.root)
        return self._state

    @property
    def workspace(self):
        if self._workspace is None:
            from opsmith._cache._workspace import Workspace
            self._workspace = Workspace(self.root)
        return self._workspace

    def __repr__(self) -> str:
        return f"Cache({os.fspath(self.root)!r}, store={type(self.store).__name__})"


_CACHES: dict[tuple[str, str], Cache] = {}


def _backend(spec: str):
    if spec == "local":
        from opsmith._cache._local import LocalStore
        return LocalStore
    mod, sep, cls = spec.partition(":")
    if not sep or not mod or not cls:
        raise ConfigError(f"OPSMITH_STORE_BACKEND={spec!r}: expected 'local' or 'module:Class'")
    import importlib
    try:
        backend = getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"OPSMITH_STORE_BACKEND={spec!r}: cannot import it ({exc}). Name an "
                          f"importable module and a Store subclass in it, or unset the variable.") from None
    if not (isinstance(backend, type) and issubclass(backend, Store)):
        raise ConfigError(f"OPSMITH_STORE_BACKEND={spec!r} is not a subclass of opsmith's Store")
    return backend


def open_cache(root: str | os.PathLike | None = None) -> Cache:
    """The store, locks, state and workspace at ``root`` (default: ``settings.cache_path``).

    One object per root and backend per process; nothing is created until it is used.
    """
    from opsmith._config import settings
    if root is None:
        root = settings.cache_path
    root = os.path.abspath(os.fspath(root))
    spec = settings.store_backend
    cache = _CACHES.get((root, spec))
    if cache is None:
        store = _backend(spec)(root)
        wrap = _remote_wrapper()
        if wrap is not None:
            store = wrap(store)
        cache = _CACHES[(root, spec)] = Cache(Path(root), store)
    return cache


def _remote_wrapper():
    """The shared-cache wrapper when a remote cache is configured (``OPSMITH_REMOTE_CACHE``)."""
    from opsmith._config import settings
    if not settings.remote_cache:
        return None  # the local store alone: nothing of the remote tier is imported
    from opsmith._cache._tiered import wrap
    return wrap


def open_store(root: str | os.PathLike | None = None) -> Store:
    """The store at ``root`` (see :func:`open_cache`)."""
    return open_cache(root).store


@on_reset
def reset() -> None:
    """Forget every process-wide cache of this package (open stores, checked roots).

    Tests call it instead of poking private names; so does a program that changed
    ``OPSMITH_CACHE_DIR``'s directory under a running process.
    """
    from opsmith._cache import _root
    _CACHES.clear()
    _root.forget()
