"""One compile of a graph per cluster: wait for another process's compile, or hold its lease.

inductor looks a graph up (a miss), compiles it, then publishes it: two calls into the cache
backend with the compile between them. So the lease is taken at the miss and held until the
publish of that key, as opsmith's builders hold it around "look again, then build":

1. the machine's OS lock of the key (``Locks.path``: one process per machine talks to the
   lease, the others wait here and find the entry locally when it is released);
2. the store's ``build_lease`` (with a shared cache: the cluster-wide fencing lease in Redis,
   whose waiters poll for the entry);
3. look again: another process may have published the entry while we waited.

Both waits end after ``OPSMITH_COMPILE_CACHE_WAIT`` seconds (a holder that is alive but stuck),
and the Redis wait as soon as Redis stops answering: then this process compiles too (fail
open). A held lease is released when its entry is published, when the compile fails, or at
the end of the compile it belongs to (inductor may skip the publish, e.g. for a graph it
cannot serialise), and at exit.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Leases"]

log = logging.getLogger("opsmith.compile_cache")


class _Held:
    __slots__ = ("key", "lease", "lock", "thread")

    def __init__(self, key: str, lock, lease) -> None:
        self.key, self.lock, self.lease = key, lock, lease
        self.thread = threading.get_ident()


class Leases:
    """The leases this process holds on graph keys of one cache."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self._held: dict[str, _Held] = {}
        self._mutex = threading.Lock()

    def wait_or_take(self, key: str, lookup: Callable[[], bytes | None], wait: float) -> tuple[bytes | None, float]:
        """After a miss of ``key``: the entry another process published while we waited, or
        None with the lease now held by this thread. Also returns the seconds spent waiting."""
        import filelock
        start = time.monotonic()
        # not thread-local: inductor may publish (and so release) from another thread
        lock = filelock.FileLock(self.cache.locks.path(key), mode=0o600, thread_local=False)
        try:
            lock.acquire(timeout=0.5)
        except filelock.Timeout:
            log.info("waiting for another process on this machine compiling graph %s", key[:16])
            try:
                lock.acquire(timeout=max(wait - (time.monotonic() - start), 0.0))
            except filelock.Timeout:
                log.warning("gave up waiting for another process compiling graph %s after %.0f s "
                            "(OPSMITH_COMPILE_CACHE_WAIT); compiling it here too", key[:16], wait)
                return None, time.monotonic() - start
        try:
            data = lookup()
            if data is not None:
                lock.release()
                return data, time.monotonic() - start
            remaining = max(wait - (time.monotonic() - start), 0.0)
            lease = self.cache.store.build_lease(key, wait=remaining)
            lease.__enter__()
            try:
                data = lookup()
            except BaseException:
                lease.__exit__(None, None, None)
                raise
        except BaseException:
            lock.release()
            raise
        if data is not None:
            lease.__exit__(None, None, None)
            lock.release()
            return data, time.monotonic() - start
        with self._mutex:
            self._held[key] = _Held(key, lock, lease)
        return None, time.monotonic() - start

    def holds(self, key: str) -> bool:
        return key in self._held

    def release(self, key: str) -> None:
        """Give up the lease on ``key`` if this process holds it."""
        with self._mutex:
            held = self._held.pop(key, None)
        if held is not None:
            _free(held)

    def release_thread(self) -> None:
        """Give up every lease the calling thread holds (its compile ended)."""
        me = threading.get_ident()
        with self._mutex:
            mine = [h for h in self._held.values() if h.thread == me]
            for h in mine:
                del self._held[h.key]
        for h in mine:
            log.debug("released the lease on %s at the end of its compile (nothing was published)", h.key[:16])
            _free(h)

    def release_all(self) -> None:
        with self._mutex:
            held, self._held = list(self._held.values()), {}
        for h in held:
            _free(h)


def _free(held: _Held) -> None:
    try:
        held.lease.__exit__(None, None, None)
    finally:
        held.lock.release()
