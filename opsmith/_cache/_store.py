"""The artifact-store boundary: immutable entries, published atomically, verified on read.

An entry is a bundle: a manifest (kind, name, metadata, and the sha256 and size of every
file) and its files. :class:`Store` is the interface every caller uses (get / put / list /
remove / verify, plus ``record_use`` and ``build_lease``); only a backend knows how entries
lie on disk (:class:`~opsmith._cache._local.LocalStore` is the default). The backend is
chosen by ``settings.store_backend``: ``"local"`` or ``"module:Class"`` (constructed with the
cache root), as triton's ``TRITON_CACHE_MANAGER``.

Locks (:mod:`._locks`), machine-local state (:mod:`._state`) and build workspaces
(:mod:`._workspace`) are separate objects over the same root; :func:`~opsmith._cache._open.open_cache`
gives all four.
"""
from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opsmith._record import Record

__all__ = ["Entry", "EntryInfo", "Store"]


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

    def build_lease(self, key: str, *, wait: float | None = None) -> contextlib.AbstractContextManager:
        """Held (after the local build lock) around "look again, then build" ``key``.

        A shared backend uses it so that one machine of a cluster builds while the others
        wait (at most ``wait`` seconds when given, then build anyway); a local store needs
        nothing beyond the OS lock.
        """
        return contextlib.nullcontext()
