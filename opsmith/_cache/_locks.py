"""Inter-process build locks: OS locks (``flock`` through ``filelock``) under ``<root>/locks``.

The kernel releases a lock when its process dies, so a build killed at any moment never
blocks the next one. Locks are machine-local and never go through a store backend: they
only save duplicate work, since entries are published atomically.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from opsmith._cache._root import disk_error, ensure_root, require_writable

__all__ = ["Locks"]

log = logging.getLogger("opsmith.cache")


class Locks:
    """The build locks of one cache directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(os.fspath(root)))
        self.dir = self.root / "locks"

    def path(self, key: str) -> str:
        """The lock file that :meth:`hold` takes for ``key``."""
        if ensure_root(self.root):
            self.dir.mkdir(mode=0o700, exist_ok=True)
        return os.fspath(self.dir / f"{key}.lock")

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold the lock for building ``key`` (waiting, with a log line, while another has it)."""
        import filelock  # a warm load never locks, and filelock costs ~9 ms to import
        # Only a build locks: on a read-only or foreign-permission root say so (naming the
        # directory and OPSMITH_CACHE_DIR) rather than let filelock's OSError through.
        require_writable(self.root, f"build {key[:16]}")
        lk = filelock.FileLock(self.path(key), mode=0o600)
        try:
            try:
                lk.acquire(timeout=2.0)
            except filelock.Timeout:
                log.info("waiting for another process that is building %s", key)
                lk.acquire()
        except OSError as exc:
            raise disk_error(exc, self.root) from None
        try:
            yield
        finally:
            lk.release()

    def sweep(self, idle_seconds: float = 3600.0) -> int:
        """Delete lock files that no process holds and none has opened for ``idle_seconds``.

        Each is taken (``flock``, without waiting) before it is unlinked, so a held lock is
        never removed, and only if the path still names the file taken. The one remaining
        race (a process that opened an idle lock file in the instant before it was unlinked)
        can cost a duplicate build, never a wrong entry. Returns how many were deleted.
        """
        import fcntl
        removed = 0
        now = time.time()
        for path in self.dir.glob("*.lock"):
            try:
                if now - path.stat().st_mtime < idle_seconds:
                    continue
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino == path.stat().st_ino:
                    path.unlink()
                    removed += 1
            except OSError:
                pass  # held by a process, or gone: leave it
            finally:
                os.close(fd)  # releases the flock
        return removed
