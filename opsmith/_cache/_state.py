"""Machine-local state: facts true only on this machine, kept beside the cache.

PATH look-ups, compiler and NVRTC probes, the visible GPUs, the dependency index and the warm
index are small JSON documents under ``<root>/records/<namespace>/<ident>.json``, replaced
atomically. They are optimisations: a missing, unreadable or foreign document is a miss, and
a failed write (a full disk, a read-only cache) is logged and skipped, never an error. None of
it is shared through a store backend.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["State", "memo"]

log = logging.getLogger("opsmith.cache")
_MISS = object()


class State:
    """The machine-local documents of one cache directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(os.fspath(root)))

    def _path(self, namespace: str, ident: str) -> str:
        if not ident or "/" in ident or ident.startswith(".") or "/" in namespace:
            raise ValueError(f"invalid state name {namespace!r}/{ident!r}")
        return os.path.join(self.root, "records", namespace, ident + ".json")

    def get(self, namespace: str, ident: str) -> Any | None:
        """The document, or None (missing, unreadable, or not written by this user)."""
        try:
            with open(self._path(namespace, ident), "rb") as f:
                if os.fstat(f.fileno()).st_uid != os.getuid():
                    return None
                return json.loads(f.read())
        except (OSError, ValueError):
            return None

    def put(self, namespace: str, ident: str, value: Any) -> bool:
        """Replace the document atomically; False (logged) when it could not be written."""
        import uuid
        from opsmith._cache._root import ensure_root
        path = self._path(namespace, ident)
        tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{uuid.uuid4().hex[:8]}"
        try:
            if not ensure_root(self.root):
                return False
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(tmp, "w") as f:
                f.write(json.dumps(value, sort_keys=True))
            from opsmith._cache._faults import point
            point(f"state:{namespace}")  # the fault suite's pause (writes only)
            os.replace(tmp, path)
            return True
        except (OSError, ValueError, TypeError) as exc:
            log.debug("state %s/%s not written: %s", namespace, ident, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False

    def memo(self, namespace: str, ident: str, compute: Callable[[], Any],
             valid: Callable[[Any], bool] = lambda doc: True) -> Any:
        """``compute()``'s answer, remembered under ``namespace/ident`` while ``valid(doc)`` holds.

        The one way opsmith remembers a probe across processes: the document is read,
        checked with ``valid`` (a stamp comparison, a shape check), and recomputed and
        replaced when it fails.
        """
        doc = self.get(namespace, ident)
        if doc is not None:
            try:
                if valid(doc):
                    return doc
            except (KeyError, TypeError, ValueError, IndexError):
                pass
        doc = compute()
        self.put(namespace, ident, doc)
        return doc


def memo(state: State | None, namespace: str, ident: str, compute: Callable[[], Any],
         valid: Callable[[Any], bool] = lambda doc: True) -> Any:
    """:meth:`State.memo`, or ``compute()`` alone where there is no state (``state`` is None)."""
    return compute() if state is None else state.memo(namespace, ident, compute, valid)
