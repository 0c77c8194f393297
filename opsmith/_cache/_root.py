"""The cache directory itself: created private, refused when unsafe, read-only tolerated.

Every object over a cache root (the local store, the locks, the machine-local state, the
build workspace) opens the directory through :func:`ensure_root` and reports a failed write
through :func:`disk_error`, so that the checks and the messages exist once.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from opsmith._errors import CacheError

__all__ = ["ensure_root", "check_private_dir", "disk_error", "read_only", "require_writable"]

_CHECKED: dict[str, bool] = {}  # root -> writable, for roots that passed the checks


def read_only(path: str | os.PathLike) -> bool:
    """True when ``path`` lies on a filesystem mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_private_dir(path: Path, st: os.stat_result) -> None:
    """Refuse a cache directory owned by someone else or writable by others.

    A directory on a read-only filesystem cannot be written by anyone, whatever its mode
    (a container image mounted read-only with mode 1777, say): it is not refused for it.
    """
    if st.st_uid != os.getuid():
        raise CacheError(
            f"the cache directory {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
            f"loading from it would run their code. Set OPSMITH_CACHE_DIR to a directory of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not read_only(path):
        raise CacheError(
            f"the cache directory {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"they could replace the code you load. Run: chmod 700 {path}")


def ensure_root(root: Path) -> bool:
    """Create ``root`` (mode 0700) if needed, refuse an unsafe one; True when it is writable.

    A root that exists but cannot be written (a read-only mount, a directory without the
    write bit) is accepted: hits are served from it and anything that must be written
    raises :func:`require_writable`'s error then.
    """
    key = os.fspath(root)
    known = _CHECKED.get(key)
    if known is not None:
        return known
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        if not root.is_dir():
            raise CacheError(f"cannot create the cache directory {root}: {exc.strerror}. "
                             f"Set OPSMITH_CACHE_DIR to a directory you can write.") from None
    check_private_dir(root, root.stat())
    writable = os.access(root, os.W_OK | os.X_OK) and not read_only(root)
    _CHECKED[key] = writable
    return writable


def require_writable(root: Path, what: str) -> None:
    """Raise a :class:`CacheError` that says why ``root`` cannot take ``what`` and what to do."""
    if ensure_root(root):
        return
    if read_only(root):
        raise CacheError(f"cannot {what}: the cache directory {root} is on a read-only filesystem. "
                         f"Hits are still served from it; to build, set OPSMITH_CACHE_DIR to a "
                         f"writable directory (and copy or mount this cache there).")
    raise CacheError(f"cannot {what}: the cache directory {root} is not writable by you. Fix its "
                     f"permissions (chmod 700 {root}) or set OPSMITH_CACHE_DIR to a writable directory.")


def _free(path: Path) -> str:
    import shutil
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"


def disk_error(exc: OSError, root: Path) -> CacheError | OSError:
    """A failed write under ``root`` as a :class:`CacheError` with the fix, else ``exc``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheError(
            f"no space left on the device holding the cache {root} ({_free(root)} free). Free space "
            f"on that filesystem, or set OPSMITH_CACHE_DIR to a directory on a disk with room; "
            f"`opsmith cache prune --max-size SIZE` helps only when the cache itself is what fills it.")
    if exc.errno == errno.EROFS:
        return CacheError(f"cannot write to the cache {root}: it is on a read-only filesystem. Set "
                          f"OPSMITH_CACHE_DIR to a writable directory.")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return CacheError(f"cannot write to the cache {root}: {exc.strerror}. Fix its permissions "
                          f"(chmod 700 {root}) or set OPSMITH_CACHE_DIR to a writable directory.")
    return exc


def forget() -> None:
    """Forget which roots passed the checks (tests that change a directory's mode)."""
    _CHECKED.clear()
