"""The cluster cache: a local store in front of a shared remote (Redis), and must-hit mode.

Lookup order: local -> remote -> miss. A remote hit is checked (signature, then every file's
sha256: :mod:`opsmith._cache._bundle`) and written into the local store, so the next process
on this machine loads it locally. A build is published locally, then remotely (signed).
``build_lease`` is the remote's per-key lease: one process in the cluster builds a missing
entry, the others wait for it and load the result.

Counters per tier (hits, misses, puts, refusals, errors, seconds spent in lookups) are kept in
memory and added to ``<cache>/tier-stats.json`` when the process exits (and after each remote
put or hit, which are rare), for ``opsmith cache stats``.

Must-hit mode (``OPSMITH_MUST_HIT=1``, for production and CI): :func:`check_must_hit` is
called by the builders right before a compile starts and raises a :class:`CacheError`
naming the key and why each tier missed.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opsmith._errors import CacheError
from opsmith._cache._store import Entry, EntryInfo, Store

__all__ = ["TieredStore", "SharedState", "shared_state", "wrap", "check_must_hit", "tier_stats",
           "STATS_FILE"]

log = logging.getLogger("opsmith.cache")

STATS_FILE = "tier-stats.json"
_COUNTERS = ("hits", "misses", "puts", "refused", "errors", "seconds")

_misses: dict[str, str] = {}       # key -> why the last lookup of it missed (for must-hit)
_reported: set[tuple[str, str]] = set()


def _new_counts() -> dict[str, dict[str, float]]:
    return {"local": dict.fromkeys(_COUNTERS, 0), "remote": dict.fromkeys(_COUNTERS, 0)}


class TieredStore(Store):
    """``local`` in front of ``remote`` (a :class:`~opsmith._cache._redis.RedisRemote`).

    Parameters
    ----------
    local : Store
        The machine's store; anything else asked of this store is passed to it.
    remote : RedisRemote
    signer : Signer or None
        Signs what is published and checks what is loaded.
    trust_unsigned : bool
        Without a signer: load (and publish) unsigned entries. With neither, the remote is
        not used at all (and says so once).
    """

    def __init__(self, local: Store, remote, *, signer=None, trust_unsigned: bool = False) -> None:
        self.local = local
        self.remote = remote
        self.signer = signer
        self.trust_unsigned = trust_unsigned
        self.usable = signer is not None or trust_unsigned
        self._tokens = threading.local()
        self._counts = _new_counts()
        self._flushed = _new_counts()
        self._stats_lock = threading.Lock()
        root = getattr(local, "root", None)
        self._stats_path = Path(root) / STATS_FILE if root is not None else None
        if not self.usable:
            log.warning("OPSMITH_REMOTE_CACHE is set but no signing key (OPSMITH_REMOTE_KEY_FILE): "
                        "the shared cache %s is not used, since nothing loaded from it could be "
                        "verified. Set the key file, or OPSMITH_REMOTE_TRUST_UNSIGNED=1 to load "
                        "unsigned native code.", remote.where)
        atexit.register(self.flush_stats)

    def __repr__(self) -> str:
        return f"TieredStore({self.local!r}, {self.remote!r}, signed={self.signer is not None})"

    def __getattr__(self, name: str) -> Any:
        # ensure(), root and anything a backend adds: the local store's (never remote).
        if name in ("local", "remote"):
            raise AttributeError(name)
        return getattr(self.local, name)

    # -- counters -----------------------------------------------------------------------------
    def _count(self, tier: str, what: str, n: float = 1) -> None:
        with self._stats_lock:
            self._counts[tier][what] += n

    def flush_stats(self) -> None:
        """Add this process's counters to the stats file (atomically, under a file lock)."""
        if self._stats_path is None:
            return
        with self._stats_lock:
            delta = {t: {c: self._counts[t][c] - self._flushed[t][c] for c in _COUNTERS}
                     for t in self._counts}
            if not any(v for d in delta.values() for v in d.values()):
                return
            self._flushed = {t: dict(c) for t, c in self._counts.items()}
        with contextlib.suppress(OSError):
            _add_to_stats(self._stats_path, delta, self.remote.where)

    # -- Store: entries -----------------------------------------------------------------------
    def get(self, key: str, *, record_use: bool = True) -> Entry | None:
        entry = self.local.get(key, record_use=record_use)
        if entry is not None:
            self._count("local", "hits")
            return entry
        self._count("local", "misses")
        where = getattr(self.local, "root", "the local store")
        if not self.usable:
            _misses[key] = f"not in the local cache ({where}); the shared cache is unused (no signing key)"
            return None
        from opsmith._cache._bundle import Refused, unpack
        from opsmith._cache._redis import RemoteDown
        t0 = time.perf_counter()
        try:
            data = self.remote.get_bundle(key)
        except RemoteDown as exc:
            self._count("remote", "errors")
            _misses[key] = f"not in the local cache ({where}); the shared cache {self.remote.where} did not answer ({exc})"
            return None
        if data is None:
            self._count("remote", "misses")
            self._count("remote", "seconds", time.perf_counter() - t0)
            _misses[key] = f"not in the local cache ({where}) nor in the shared cache {self.remote.where}"
            return None
        try:
            bundle = unpack(data, key, signer=self.signer, trust_unsigned=self.trust_unsigned)
        except Refused as exc:
            self._refused(key, exc)
            _misses[key] = f"not in the local cache ({where}); the shared cache's entry was refused: {exc.reason}"
            return None
        entry = self._install(bundle)
        self._count("remote", "hits")
        self._count("remote", "seconds", time.perf_counter() - t0)
        _misses.pop(key, None)
        log.debug("shared cache hit for %s (%d bytes, %.1f ms)", key, len(data), 1000 * (time.perf_counter() - t0))
        return entry

    def _refused(self, key: str, exc) -> None:
        self._count("remote", "refused")
        if (key, self.remote.where) not in _reported:
            _reported.add((key, self.remote.where))
            log.warning("refused the shared cache's entry %s from %s: %s; not loaded, building "
                        "locally instead", key, self.remote.where, exc.reason)

    def _install(self, bundle) -> Entry:
        """Write a checked bundle into the local store (its put is the atomic publish)."""
        root = getattr(self.local, "root", None)
        tmp_parent = Path(root) / "tmp" if root is not None and (Path(root) / "tmp").is_dir() else None
        with tempfile.TemporaryDirectory(prefix="remote-", dir=tmp_parent) as tmp:
            files = bundle.write_files(Path(tmp))
            m = bundle.manifest
            return self.local.put(bundle.key, files, kind=m.get("kind", ""), name=m.get("name", ""),
                                  meta=m.get("meta") or {}, move=True)

    def put(self, key: str, files: Mapping[str, str | os.PathLike], *, kind: str, name: str = "",
            meta: Mapping[str, Any] | None = None, move: bool = False) -> Entry:
        entry = self.local.put(key, files, kind=kind, name=name, meta=meta, move=move)
        self._count("local", "puts")
        if self.usable:
            self.publish(entry)
        return entry

    def publish(self, entry: Entry, token: int | None = None) -> bool:
        """Send a local entry to the remote (signed); False if it was not stored there."""
        from opsmith._cache._bundle import pack_entry
        from opsmith._cache._redis import RemoteDown
        lease_key = None
        if token is None:
            token, lease_key = getattr(self._tokens, "lease", (None, None))
        try:
            data = pack_entry(entry, self.signer)
        except OSError as exc:  # the local entry's files could not be read back
            log.warning("could not publish %s to the shared cache: %s", entry.key, exc)
            return False
        limit = getattr(self.remote, "max_entry", None)
        if limit is not None and len(data) > limit:
            log.warning("did not publish %s (%s, %d bytes) to the shared cache: it is over "
                        "OPSMITH_REMOTE_MAX_ENTRY (%d bytes), so no node would load it; raise that "
                        "limit on every node to share entries this big", entry.key,
                        entry.manifest.get("name") or entry.manifest.get("kind"), len(data), limit)
            return False
        try:
            ok = self.remote.put_bundle(entry.key, data, token, lease_key)
        except RemoteDown:
            self._count("remote", "errors")
            return False
        if ok:
            self._count("remote", "puts")
        else:
            log.warning("did not publish %s to the shared cache: this build's lease expired and "
                        "another process took it over (its result wins)", entry.key)
        self.flush_stats()
        return ok

    def list(self) -> Iterator[EntryInfo]:
        return self.local.list()

    def remove(self, key: str) -> bool:
        return self.local.remove(key)

    def verify(self, key: str) -> str | None:
        return self.local.verify(key)

    def record_use(self, key: str) -> None:
        self.local.record_use(key)
        self._count("local", "hits")

    @contextlib.contextmanager
    def build_lease(self, key: str, *, wait: float | None = None) -> Iterator[None]:
        """The cluster-wide lease on building ``key`` (after the local OS lock is held)."""
        if not self.usable:
            yield
            return
        ready = (lambda: self.remote.has_bundle(key))
        with self.remote.lease(key, ready=ready, wait=wait) as token:
            saved = getattr(self._tokens, "lease", (None, None))
            self._tokens.lease = (token, key) if token else (None, None)
            try:
                yield
            finally:
                self._tokens.lease = saved



class SharedState:
    """A view of the machine-local state whose documents also travel through the remote.

    Given only to the dependency index: a machine that never compiled a unit cannot name
    its key without it (the key covers the headers the compiler read). Documents are signed
    like entries; one read from the remote is kept locally. Everything else in the state
    (tool identities, probes) is machine-local and never goes through this view.
    """

    def __init__(self, state, store: TieredStore) -> None:
        self.state = state
        self.store = store

    def __getattr__(self, name: str) -> Any:
        if name in ("state", "store"):
            raise AttributeError(name)
        return getattr(self.state, name)

    def get(self, namespace: str, ident: str) -> Any | None:
        value = self.state.get(namespace, ident)
        st = self.store
        if value is not None or not st.usable:
            return value
        from opsmith._cache._bundle import Refused, check_record
        from opsmith._cache._redis import RemoteDown
        try:
            raw = st.remote.get_record(namespace, ident)
        except RemoteDown:
            st._count("remote", "errors")
            return None
        if raw is None:
            return None
        try:
            value = check_record(raw, namespace, ident, signer=st.signer, trust_unsigned=st.trust_unsigned)
        except Refused as exc:
            st._refused(f"{namespace}/{ident}", exc)
            return None
        self.state.put(namespace, ident, value)
        return value

    def put(self, namespace: str, ident: str, value: Any) -> bool:
        ok = self.state.put(namespace, ident, value)
        st = self.store
        if st.usable:
            from opsmith._cache._bundle import sign_record
            from opsmith._cache._redis import RemoteDown
            try:
                st.remote.put_record(namespace, ident, sign_record(namespace, ident, value, st.signer))
            except RemoteDown:
                st._count("remote", "errors")
        return ok


def shared_state(cache):
    """``cache.state`` with the dependency index shared when ``cache.store`` is tiered.

    The engine reads and records the dependency index through it, so that a unit built on
    one machine resolves to its key on another (see :class:`SharedState`).
    """
    if isinstance(cache.store, TieredStore):
        return SharedState(cache.state, cache.store)
    return cache.state


# -- stats file -------------------------------------------------------------------------------
def _add_to_stats(path: Path, delta: dict[str, dict[str, float]], where: str) -> None:
    import fcntl
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        current = tier_stats(path.parent)
        for tier, counts in delta.items():
            cur = current["tiers"].setdefault(tier, dict.fromkeys(_COUNTERS, 0))
            for c, v in counts.items():
                cur[c] = cur.get(c, 0) + v
        current["remote"] = where
        current["updated"] = time.time()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(current, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        os.close(fd)


def tier_stats(cache_root: str | os.PathLike) -> dict[str, Any]:
    """The counters per tier kept under ``cache_root`` (zeros when none were kept)."""
    try:
        doc = json.loads((Path(cache_root) / STATS_FILE).read_bytes())
        if isinstance(doc, dict) and isinstance(doc.get("tiers"), dict):
            return doc
    except (OSError, ValueError):
        pass
    return {"tiers": {}, "remote": None, "updated": None}


# -- must-hit ---------------------------------------------------------------------------------
def check_must_hit(key: str, what: str, why: str | None = None) -> None:
    """In must-hit mode, refuse to compile: raise a CacheError naming ``key`` and why it missed.

    Builders call it right before a compile starts (after the lookups, under their lock).
    ``what`` says what would be compiled (``"compiling relu.cu with NVRTC"``); ``why``
    overrides the reason recorded by the last lookup of ``key``.
    """
    from opsmith._config import settings
    if not settings.must_hit:
        return
    reason = why or _misses.get(key) or "it is not in the cache"
    raise CacheError(f"must-hit mode (OPSMITH_MUST_HIT=1): {what} would start a compile, but this "
                     f"process may only load cached artifacts. Cache key {key} missed: {reason}. "
                     f"Build it ahead of time (`opsmith build`, or the same code in CI), ship it "
                     f"(`opsmith cache export`/`import`, or the shared cache), or unset OPSMITH_MUST_HIT.")


# -- wiring -----------------------------------------------------------------------------------
def wrap(local: Store) -> Store:
    """The tiered store over ``local`` when ``OPSMITH_REMOTE_CACHE`` is set, else ``local``."""
    from opsmith._cache._redis import remote_from_settings
    remote = remote_from_settings()
    if remote is None:
        return local
    from opsmith._config import settings
    from opsmith._cache._bundle import signer_from_settings
    return TieredStore(local, remote, signer=signer_from_settings(),
                       trust_unsigned=settings.remote_trust_unsigned)
