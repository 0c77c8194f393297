"""Looking after the cache: list, count, prune, clear and verify its entries.

Everything here goes through the :class:`~opsmith._cache._store.Store` interface (``list``,
``remove``, ``verify``) and the build locks (``Locks.hold``, ``Locks.sweep``), so it works on
any backend that implements it. Removal is safe while
other processes use the cache: ``remove`` is an atomic rename (a reader sees the entry whole
or not at all), each removal happens under the entry's lock, and entries used in the last
:data:`BUSY_SECONDS` are skipped unless ``force`` is given, because a process that has just
found an entry may be about to load its files.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time

from opsmith._errors import ConfigError
from opsmith._cache._store import EntryInfo
from opsmith._cache._open import Cache

__all__ = [
    "BUSY_SECONDS",
    "CacheStats",
    "PruneResult",
    "clear",
    "entries",
    "format_age",
    "format_size",
    "parse_duration",
    "parse_size",
    "prune",
    "stats",
    "verify",
]

BUSY_SECONDS = 60.0

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """Bytes from ``"500M"``, ``"2G"``, ``"1.5GiB"``, ``"4096"`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGTbB]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise ConfigError(f"invalid size {text!r}: use a number with an optional unit, "
                          f"e.g. 500M, 2G, 1.5G or 1048576")
    return int(float(m[1]) * _SIZE_UNITS[m[2].lower()])


def parse_duration(text: str) -> float:
    """Seconds from ``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` (a bare number is days)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdwSMHDW]?)\s*", str(text))
    if not m:
        raise ConfigError(f"invalid duration {text!r}: use a number and a unit s, m, h, d or w, "
                          f"e.g. 30d or 12h")
    return float(m[1]) * _DURATION_UNITS[(m[2] or "d").lower()]


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def format_age(seconds: float) -> str:
    """``"12 s"``, ``"5 min"``, ``"3 h"``, ``"2 d"``: how long ago, coarsely."""
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} d"


def entries(cache: Cache) -> list[EntryInfo]:
    """Every entry, most recently used first."""
    return sorted(cache.store.list(), key=lambda e: e.last_used, reverse=True)


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """What ``opsmith cache stats`` shows.

    ``hit_rate`` is hits / (hits + entries): every entry was made by one miss (a build), and
    every later lookup that found it is a hit.
    """

    root: str
    entries: int
    bytes: int
    hits: int
    hit_rate: float | None
    by_kind: dict[str, dict[str, int]]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def stats(cache: Cache, root: str = "") -> CacheStats:
    items = list(cache.store.list())
    by_kind: dict[str, dict[str, int]] = {}
    for e in items:
        k = by_kind.setdefault(e.kind, {"entries": 0, "bytes": 0, "hits": 0})
        k["entries"] += 1
        k["bytes"] += e.size
        k["hits"] += e.hits
    hits = sum(e.hits for e in items)
    lookups = hits + len(items)
    return CacheStats(root, len(items), sum(e.size for e in items), hits,
                      (hits / lookups) if lookups else None, dict(sorted(by_kind.items())))


@dataclasses.dataclass
class PruneResult:
    """Entries removed, bytes freed, and entries kept because another process just used them."""

    removed: list[EntryInfo] = dataclasses.field(default_factory=list)
    skipped_busy: list[EntryInfo] = dataclasses.field(default_factory=list)
    remaining_bytes: int = 0
    locks_removed: int = 0  # idle lock files deleted (see Locks.sweep)

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.removed)


def _last_used_now(info: EntryInfo) -> float | None:
    """The entry's last use, read again (another process may have used it since we listed).

    None when the entry is gone. Reads the ``uses`` file's mtime (see ``_store``).
    """
    try:
        return os.stat(os.path.join(info.path, "uses")).st_mtime
    except FileNotFoundError:
        return info.last_used if os.path.isdir(info.path) else None


def _remove(cache: Cache, info: EntryInfo, *, force: bool, now: float, result: PruneResult,
            dry_run: bool) -> bool:
    if not force and now - info.last_used < BUSY_SECONDS:
        result.skipped_busy.append(info)
        return False
    if dry_run:
        result.removed.append(info)
        return True
    with cache.locks.hold(info.key):
        if not force:
            last = _last_used_now(info) if info.kind != "corrupt" else info.last_used
            if last is None:
                return False  # someone else removed it
            if time.time() - last < BUSY_SECONDS:
                result.skipped_busy.append(info)
                return False
        if cache.store.remove(info.key):
            result.removed.append(info)
            return True
    return False


def prune(cache: Cache, *, max_size: int | None = None, older_than: float | None = None,
          force: bool = False, dry_run: bool = False, now: float | None = None) -> PruneResult:
    """Remove least recently used entries until the cache holds at most ``max_size`` bytes,
    and every entry unused for ``older_than`` seconds.

    Examples
    --------
    >>> from opsmith._cache._store import open_cache
    >>> prune(open_cache(), max_size=parse_size("2G"))          # doctest: +SKIP
    """
    if max_size is None and older_than is None:
        raise ConfigError("prune needs --max-size or --older-than (or both), e.g. --max-size 2G")
    now = time.time() if now is None else now
    items = sorted(cache.store.list(), key=lambda e: e.last_used)  # least recently used first
    total = sum(e.size for e in items)
    result = PruneResult()
    for info in items:
        too_old = older_than is not None and now - info.last_used > older_than
        too_big = max_size is not None and total > max_size
        if not (too_old or too_big):
            continue
        if _remove(cache, info, force=force, now=now, result=result, dry_run=dry_run):
            total -= info.size
    result.remaining_bytes = total
    if not dry_run:
        result.locks_removed = cache.locks.sweep(LOCK_IDLE_SECONDS)
    return result


LOCK_IDLE_SECONDS = 3600.0


def clear(cache: Cache, *, force: bool = True) -> PruneResult:
    """Remove every entry (each under its lock). ``force=False`` keeps entries in use right now."""
    result = PruneResult()
    now = time.time()
    for info in list(cache.store.list()):
        _remove(cache, info, force=force, now=now, result=result, dry_run=False)
    result.remaining_bytes = sum(e.size for e in cache.store.list())
    # Every lock nobody holds (force) or nobody has opened for a while: none guards an entry now.
    result.locks_removed = cache.locks.sweep(0.0 if force else LOCK_IDLE_SECONDS)
    return result


def verify(cache: Cache, *, remove: bool = True) -> tuple[int, list[tuple[EntryInfo, str]]]:
    """Re-hash every entry. Returns (entries checked, [(entry, problem)]); corrupt ones are removed."""
    bad: list[tuple[EntryInfo, str]] = []
    checked = 0
    for info in list(cache.store.list()):
        checked += 1
        problem = cache.store.verify(info.key)
        if problem is None:
            continue
        bad.append((info, problem))
        if remove:
            with cache.locks.hold(info.key):
                if cache.store.verify(info.key) is not None:  # still corrupt (not republished meanwhile)
                    cache.store.remove(info.key)
    return checked, bad
