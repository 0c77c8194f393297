"""The artifact-store boundary: immutable entries, published atomically, verified on read.

An entry is a bundle: a manifest (kind, name, metadata, and the sha256 and size of every
file) and its files. :class:`Store` is the interface every caller uses (get / put / list /
remove / verify, plus ``record_use`` and ``build_lease``); only a backend knows how entries
lie on disk (:class:`~opsmith._cache._local.LocalStore` is the default). The backend is
chosen by ``settings.store_backend``: ``"local"`` or ``"module:Class"`` (constructed with the
cache root), as triton's ``TRITON_CACHE_MANAGER``.

Locks (:mod:`._locks`), machine-local state (:mod:`._state`) and build workspaces
(:mod:`._workspace`) are separate objects over the same root; :func:`open_cache` gives all four.
"""
from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opsmith._config import on_reset
from opsmith._errors import ConfigError
from opsmith._record import Record

__all__ = ["Entry", "EntryInfo", "Store", "Cache", "open_store", "open_cache", "reset"]


class Entry(Record):
    """A verified cache entry: its key, directory and manifest."""

    __slots__ = ('key', 'path', 'manifest')


    def file(self, name: str) -> Path:
        if name not in self.manifest["files"]:
            raise KeyError(f"entry {self.key} has no file {name!r}")
        return self.path / name

    @property
    def meta(self) -> dict[str, Any]:
        return self.manifest.get("meta", {})


class EntryInfo(Record):
    """What ``opsmith cache ls`` shows of an entry."""

    __slots__ = ('key', 'kind', 'name', 'size', 'created', 'last_used', 'hits', 'path')



class Store(abc.ABC):
    """Where built artifacts live. ``put`` must be atomic and ``get`` must verify.

    A backend is constructed with the cache root (``Backend(root)``); ``entry.path`` is a
    local directory holding the entry's files under their names (a backend that keeps them
    elsewhere materialises that directory on ``get``).
    """

    @abc.abstractmethod
    def get(self, key: str, *, record_use: bool = True) -> Entry | None:
        """The verified entry for ``key``, or None (a corrupt entry is removed and is a miss)."""

    @abc.abstractmethod
    def put(self, key: str, files: Mapping[str, str | os.PathLike], *, kind: str, name: str = "",
            meta: Mapping[str, Any] | None = None, move: bool = False) -> Entry:
        """Publish ``files`` (name in the entry -> path now) under ``key`` atomically."""

    @abc.abstractmethod
    def list(self) -> Iterator[EntryInfo]:
        """Every entry, unverified."""

    @abc.abstractmethod
    def remove(self, key: str) -> bool:
        """Remove an entry; True if it existed."""

    @abc.abstractmethod
    def verify(self, key: str) -> str | None:
        """Re-hash an entry's files: None when sound, else what is wrong."""

    def record_use(self, key: str) -> None:
        """Count a hit on ``key`` that was answered without :meth:`get` (the warm index)."""

    def use_counter(self, key: str) -> str | None:
        """A file to which one byte per hit of ``key`` may be appended, or None.

        The warm index remembers it, so that a warm load counts its hit without importing
        the store; a backend without such a file returns None and is asked ``record_use``.
        """
        return None

    def build_lease(self, key: str) -> contextlib.AbstractContextManager:
        """Held (after the local build lock) around "look again, then build" ``key``.

        A shared backend uses it so that one machine of a cluster builds while the others
        wait; a local store needs nothing beyond the OS lock.
        """
        return contextlib.nullcontext()


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
