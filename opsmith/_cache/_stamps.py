"""The one stat-stamp policy: has a file changed since we last looked at it?

A stamp is ``[size, mtime_ns, ctime_ns, inode]``. ``ctime`` cannot be set by ``utime()``:
any write to a file (or a replacement of it) moves it, so an edit that keeps the size and
restores the mtime is still seen. Every cache in opsmith that trusts a file because it has
not changed (entry verification, the dependency index, the warm index, toolchain probes)
uses this stamp and nothing weaker.
"""
from __future__ import annotations

import os

__all__ = ["stamp", "stamp_of", "unchanged"]


def stamp_of(st: os.stat_result) -> list[int]:
    """The stamp of a ``stat`` result."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def stamp(path: str | os.PathLike) -> list[int]:
    """The stamp of the file at ``path`` (raises OSError when it is gone)."""
    return stamp_of(os.stat(path))


def unchanged(path: str | os.PathLike, recorded) -> bool:
    """True when ``path`` still has the ``recorded`` stamp."""
    try:
        return stamp(path) == list(recorded)
    except (OSError, TypeError):
        return False
