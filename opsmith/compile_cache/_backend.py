"""inductor's cache backend on top of opsmith's store: graphs, AOTAutograd entries, autotuning.

inductor hands a backend bytes under its own keys (``pt2:fx-graph-v1::<hash>:c1``: torch's
hash of the graph, its inputs, inductor's config, torch's sources, the GPU and the CUDA and
Triton versions). Each is one entry of opsmith's store, named by a typed hash of that key
and torch's version, holding the bytes as the file ``data``: so it is published atomically,
verified on read, signed in the shared tier, counted, exported and imported as any opsmith
entry. A hit returns the bytes inductor wrote; torch's key decides what a hit is.

For FX graphs (the expensive compiles) a miss also goes through :mod:`._lease`: the first
process compiles, the others wait for its entry.
"""
from __future__ import annotations

import logging
import sys
import tempfile
import threading
from pathlib import Path

from opsmith._cache._keys import KeyBuilder
from opsmith.compile_cache._torch_private import RemoteCacheBackend, torch_identity

__all__ = ["KIND", "CompileCache", "entry_key"]

log = logging.getLogger("opsmith.compile_cache")

KIND = "torch-compile"
DATA = "data"
LEASED = frozenset({"fx-graph"})


def entry_key(artifact: str, key: str) -> str:
    """opsmith's cache key for inductor's ``key`` of ``artifact``."""
    version, git = torch_identity()
    return KeyBuilder("torch-compile-v1").str("artifact", artifact).str("torch", version) \
        .str("torch-git", git).str("key", key).hexdigest()


class CompileCache:
    """What :func:`opsmith.compile_cache.enable` installs: the store, leases and counters."""

    def __init__(self, cache, wait: float) -> None:
        from opsmith.compile_cache._lease import Leases
        from opsmith.compile_cache._stats import Counters
        self.cache = cache
        self.wait = wait
        self.counters = Counters(cache.root)
        self.leases = Leases(cache)
        self._last_miss = threading.local()
        self._stubs_hooked = False

    # -- entries ----------------------------------------------------------------------------
    def read(self, okey: str) -> bytes | None:
        entry = self.cache.store.get(okey)
        return None if entry is None else entry.file(DATA).read_bytes()

    def write(self, okey: str, data: bytes, *, artifact: str, name: str, meta: dict) -> None:
        root = Path(self.cache.root)
        tmp_parent = root / "tmp" if (root / "tmp").is_dir() else None
        with tempfile.TemporaryDirectory(prefix="compile-", dir=tmp_parent) as tmp:
            path = Path(tmp) / DATA
            path.write_bytes(data)
            self.cache.store.put(okey, {DATA: path}, kind=KIND, name=name, meta=meta, move=True)
        self.counters.add(artifact, "puts")

    # -- inductor's calls -------------------------------------------------------------------
    def get(self, artifact: str, key: str) -> bytes | None:
        if not self._stubs_hooked and "triton" in sys.modules:
            # Triton's C stubs compile when its first kernel loads, after this lookup; opsmith
            # never imports Triton itself (inductor has, by the time it keys a CUDA graph)
            self._stubs_hooked = True
            from opsmith.compile_cache import _triton_stubs
            _triton_stubs.install(self)
        okey = entry_key(artifact, key)
        data = self.read(okey)
        if data is None and artifact in LEASED and not self.leases.holds(okey):
            data, waited = self.leases.wait_or_take(okey, lambda: self.read(okey), self.wait)
            if data is not None:
                self.counters.add(artifact, "waited")
                self.counters.add(artifact, "wait_seconds", waited)
        if data is None:
            self.counters.add(artifact, "misses")
            if artifact == "fx-graph":
                self._last_miss.value = (okey, key)
            return None
        self.counters.add(artifact, "hits")
        return data

    def put(self, artifact: str, key: str, data: bytes) -> None:
        okey = entry_key(artifact, key)
        try:
            version, _ = torch_identity()
            self.write(okey, data, artifact=artifact, name=f"{artifact} {_short(key)}",
                       meta={"artifact": artifact, "inductor_key": key, "torch": version})
        finally:
            self.leases.release(okey)
            self.counters.flush()

    def last_graph_miss(self) -> tuple[str, str] | None:
        """(opsmith key, inductor key) of this thread's last FX graph miss."""
        return getattr(self._last_miss, "value", None)

    def forget_graph_miss(self) -> None:
        self._last_miss.value = None

    def backend_for(self, artifact: str):
        """What torch calls (with no argument) to make a backend for ``artifact``."""
        owner = self

        class OpsmithBackend(RemoteCacheBackend):
            def __init__(self) -> None:
                super().__init__()
                self._name = f"backend:opsmith:{artifact}"

            def _get(self, key: str) -> bytes | None:
                return owner.get(artifact, key)

            def _put(self, key: str, data: bytes) -> None:
                owner.put(artifact, key, data)

        OpsmithBackend.__qualname__ = OpsmithBackend.__name__ = "OpsmithBackend"
        return OpsmithBackend


def _short(key: str) -> str:
    """``pt2:fx-graph-v1::fabc...:c1`` -> ``fabc...`` (for names and messages)."""
    parts = [p for p in key.split(":") if len(p) >= 16]
    return parts[0][:24] if parts else key[:24]
