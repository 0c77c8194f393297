"""The compile tier's counters, per artifact, kept in ``<cache>/compile-stats.json``.

For each artifact (``fx-graph``, ``aot-autograd``, ``autotune``, ``cpp-kernel``): lookups that
hit opsmith's cache (local or shared), lookups that missed, entries published, lookups that
waited for another process's compile and got its entry, and compiles this process ran. The
counts are kept in memory and added to the file (under a file lock, atomically) at exit and
after each publish. ``opsmith cache stats`` prints them (:func:`rows`).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["COUNTERS", "STATS_FILE", "Counters", "read", "rows"]

STATS_FILE = "compile-stats.json"
COUNTERS = ("hits", "misses", "puts", "waited", "compiles", "wait_seconds")


class Counters:
    """This process's counts for one cache directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.path = Path(root) / STATS_FILE
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, float]] = {}   # since the last flush
        self._totals: dict[str, dict[str, float]] = {}   # since the process started
        atexit.register(self.flush)

    def add(self, artifact: str, what: str, n: float = 1) -> None:
        with self._lock:
            for d in (self._counts, self._totals):
                d.setdefault(artifact, dict.fromkeys(COUNTERS, 0))[what] += n

    def totals(self) -> dict[str, dict[str, float]]:
        """This process's counts so far, per artifact."""
        with self._lock:
            return {a: dict(c) for a, c in self._totals.items()}

    def flush(self) -> None:
        """Add the counts since the last flush to the file."""
        with self._lock:
            delta, self._counts = self._counts, {}
        if not any(v for c in delta.values() for v in c.values()):
            return
        with contextlib.suppress(OSError):
            _add(self.path, delta)


def _add(path: Path, delta: dict[str, dict[str, float]]) -> None:
    import fcntl
    if not path.parent.is_dir():
        return
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        doc = read(path.parent)
        for artifact, counts in delta.items():
            cur = doc["artifacts"].setdefault(artifact, dict.fromkeys(COUNTERS, 0))
            for k, v in counts.items():
                cur[k] = cur.get(k, 0) + v
        doc["updated"] = time.time()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        os.close(fd)


def read(cache_root: str | os.PathLike) -> dict[str, Any]:
    """The counts kept under ``cache_root`` (no artifacts when none were kept)."""
    try:
        doc = json.loads((Path(cache_root) / STATS_FILE).read_bytes())
        if isinstance(doc, dict) and isinstance(doc.get("artifacts"), dict):
            return doc
    except (OSError, ValueError):
        pass
    return {"artifacts": {}, "updated": None}


def rows(cache_root: str | os.PathLike) -> list[tuple[str, ...]]:
    """``opsmith cache stats``'s compile table: artifact, hits, misses, puts, waited, compiles,
    mean seconds waited (empty when the compile cache was never used here)."""
    out = []
    for artifact, c in sorted(read(cache_root)["artifacts"].items()):
        waited = int(c.get("waited", 0))
        mean = f"{c.get('wait_seconds', 0) / waited:.1f}" if waited else "-"
        out.append((artifact, *(str(int(c.get(k, 0))) for k in ("hits", "misses", "puts", "waited", "compiles")), mean))
    return out
