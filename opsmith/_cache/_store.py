"""The artifact store: content-addressed entries, published atomically, verified on read.

Layout of a :class:`LocalStore` root (mode 0700, owned by the user)::

    entries/<key>/manifest.json   kind, name, sha256 and size of every file, metadata
    entries/<key>/<files>         the artifacts (a .so, an object file, a cubin, ...)
    entries/<key>/uses            one byte appended per hit (its size is the hit count)
    entries/<key>/verified        stat stamps of the files when their sha256 was last checked
    records/<ns>/<id>.json        small documents (the dependency index), replaced atomically
    locks/<key>.lock              OS locks (flock): released by the kernel when a process dies
    tmp/                          staging directories; an entry appears only by os.replace
    logs/                         build logs kept for error messages

Callers see the :class:`Store` interface only (get / put / lock / list / remove and the
records), so that a remote backend or export/import bundles can be layered on it.
"""
from __future__ import annotations

import abc
import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opsmith._record import Record
from opsmith._errors import CacheError
from opsmith._cache._keys import file_sha256

__all__ = ["Entry", "EntryInfo", "Store", "LocalStore", "open_store"]

log = logging.getLogger("opsmith.cache")

MANIFEST = "manifest.json"
USES = "uses"
STAMPS = "verified"
_FORMAT = 1
_STALE_TMP_SECONDS = 3600.0


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
    """Where built artifacts live. Implementations must make ``put`` atomic and ``get`` verify."""

    @abc.abstractmethod
    def get(self, key: str, *, record_use: bool = True) -> Entry | None:
        """The verified entry for ``key``, or None (a corrupt entry is removed and is a miss)."""

    @abc.abstractmethod
    def put(self, key: str, files: Mapping[str, str | os.PathLike], *, kind: str, name: str = "",
            meta: Mapping[str, Any] | None = None, move: bool = False) -> Entry:
        """Publish ``files`` (name in the entry -> path now) under ``key`` atomically."""

    @abc.abstractmethod
    def lock(self, key: str) -> contextlib.AbstractContextManager:
        """An inter-process lock for building ``key``."""

    @abc.abstractmethod
    def list(self) -> Iterator[EntryInfo]:
        """Every entry, unverified."""

    @abc.abstractmethod
    def remove(self, key: str) -> bool:
        """Remove an entry; True if it existed."""

    @abc.abstractmethod
    def get_record(self, namespace: str, ident: str) -> Any | None:
        """A small JSON document, or None."""

    @abc.abstractmethod
    def put_record(self, namespace: str, ident: str, value: Any) -> None:
        """Replace a small JSON document atomically."""

    def sweep_locks(self, idle_seconds: float = 3600.0) -> int:
        """Delete lock files nobody holds or has opened for ``idle_seconds``; how many.

        A store whose locks leave no files has nothing to sweep.
        """
        return 0


class LocalStore(Store):
    """A store in a private directory on the local filesystem."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(os.fspath(root)))
        self._checked = False

    # -- safety ---------------------------------------------------------------------
    def ensure(self) -> None:
        """Create the root (mode 0700) if needed and refuse one that is unsafe to load from."""
        if self._checked:
            return
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the cache directory {self.root}: {exc.strerror}. "
                             f"Set OPSMITH_CACHE_DIR to a directory you can write.") from None
        st = self.root.stat()
        check_private_dir(self.root, st)
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise CacheError(f"the cache directory {self.root} is not writable by you. "
                             f"Fix its permissions (chmod 700) or set OPSMITH_CACHE_DIR elsewhere.")
        for sub in ("entries", "records", "locks", "tmp", "logs"):
            (self.root / sub).mkdir(mode=0o700, exist_ok=True)
        self._checked = True

    def _entry_dir(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise CacheError(f"invalid cache key {key!r}")
        return self.root / "entries" / key

    # -- get ------------------------------------------------------------------------
    def get(self, key: str, *, record_use: bool = True, verify: bool = True) -> Entry | None:
        self.ensure()
        path = self._entry_dir(key)
        try:
            fd = os.open(path / MANIFEST, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid():
                raise CacheError(
                    f"cache entry {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
                    f"loading it would run another user's code. Remove it, or use a cache "
                    f"directory of your own (OPSMITH_CACHE_DIR).")
            raw = f.read()
        manifest = _parse_manifest(raw, key)
        problem = "unreadable manifest" if manifest is None else (
            _verify_stamped(path, manifest) if verify else None)
        if problem is not None:
            log.warning("cache entry %s is corrupt (%s); removing it and rebuilding", key, problem)
            self.remove(key)
            return None
        if record_use:
            _record_use(path)
        return Entry(key, path, manifest)

    # -- put ------------------------------------------------------------------------
    def put(self, key: str, files: Mapping[str, str | os.PathLike], *, kind: str, name: str = "",
            meta: Mapping[str, Any] | None = None, move: bool = False) -> Entry:
        self.ensure()
        final = self._entry_dir(key)
        self._sweep_tmp()
        stage = Path(tempfile.mkdtemp(prefix=f"put-{key[:12]}-", dir=self.root / "tmp"))
        try:
            listing = {}
            for fname, src in files.items():
                if "/" in fname or fname in (MANIFEST, USES, STAMPS) or fname.startswith("."):
                    raise CacheError(f"invalid file name {fname!r} for a cache entry")
                dst = stage / fname
                if move:
                    shutil.move(os.fspath(src), dst)
                else:
                    shutil.copyfile(src, dst)
                listing[fname] = {"sha256": file_sha256(dst), "size": dst.stat().st_size}
            manifest = {"format": _FORMAT, "key": key, "kind": kind, "name": name,
                        "created": time.time(), "files": listing, "meta": dict(meta or {})}
            (stage / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            os.chmod(stage, 0o700)
            try:
                os.replace(stage, final)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                existing = self.get(key, record_use=False)
                if existing is not None:  # another process published the same key first
                    return existing
                os.replace(stage, final)  # the corrupt one was removed by get()
            _write_stamps(final, manifest)
            return Entry(key, final, manifest)
        except OSError as exc:
            raise _disk_error(exc, self.root) from None
        finally:
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)

    # -- lock -----------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        import filelock  # imported here: a warm load never locks, and filelock costs ~9 ms to import
        lk = filelock.FileLock(self.lock_path(key), mode=0o600)
        try:
            lk.acquire(timeout=2.0)
        except filelock.Timeout:
            log.info("waiting for another process that is building %s", key)
            lk.acquire()
        try:
            yield
        finally:
            lk.release()

    def lock_path(self, key: str) -> str:
        """The OS lock file that :meth:`lock` holds for ``key``."""
        self.ensure()
        return os.fspath(self.root / "locks" / f"{key}.lock")

    def sweep_locks(self, idle_seconds: float = 3600.0) -> int:
        """Delete lock files that no process holds and none has opened for ``idle_seconds``.

        Each is taken (``flock``, without waiting) before it is unlinked, so a held lock is
        never removed, and only if the path still names the file taken. Locks only save
        duplicate work here (entries are published atomically), so the one remaining race (a
        process that opened an idle lock file in the instant before it was unlinked) can
        cost a duplicate build, never a wrong entry. Returns how many were deleted.
        """
        import fcntl
        removed = 0
        now = time.time()
        for path in (self.root / "locks").glob("*.lock"):
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

    # -- list / remove ----------------------------------------------------------------
    def list(self) -> Iterator[EntryInfo]:
        self.ensure()
        for path in sorted((self.root / "entries").iterdir()):
            manifest = None
            try:
                manifest = _parse_manifest((path / MANIFEST).read_bytes(), path.name)
            except OSError:
                pass
            if manifest is None:
                yield EntryInfo(path.name, "corrupt", "", _du(path), 0.0, 0.0, 0, path)
                continue
            try:
                ust = (path / USES).stat()
                hits, last = ust.st_size, ust.st_mtime
            except FileNotFoundError:
                hits, last = 0, manifest.get("created", 0.0)
            size = sum(f["size"] for f in manifest["files"].values())
            yield EntryInfo(path.name, manifest.get("kind", "?"), manifest.get("name", ""), size,
                            manifest.get("created", 0.0), last, hits, path)

    def remove(self, key: str) -> bool:
        self.ensure()
        path = self._entry_dir(key)
        trash = self.root / "tmp" / f"trash-{key[:12]}-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(path, trash)  # atomic: readers see the entry or nothing
        except FileNotFoundError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def verify(self, key: str) -> str | None:
        """Re-hash an entry's files. Returns None when sound, else what is wrong."""
        path = self._entry_dir(key)
        try:
            manifest = _parse_manifest((path / MANIFEST).read_bytes(), key)
        except OSError as exc:
            return f"manifest unreadable: {exc.strerror}"
        if manifest is None:
            return "manifest unreadable"
        return _verify_files(path, manifest)

    # -- records ----------------------------------------------------------------------
    def _record_path(self, namespace: str, ident: str) -> Path:
        return self.root / "records" / namespace / f"{ident}.json"

    def get_record(self, namespace: str, ident: str) -> Any | None:
        self.ensure()
        try:
            return json.loads(self._record_path(namespace, ident).read_bytes())
        except (OSError, ValueError):
            return None

    def put_record(self, namespace: str, ident: str, value: Any) -> None:
        self.ensure()
        path = self._record_path(namespace, ident)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        try:
            tmp.write_text(json.dumps(value, sort_keys=True))
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise _disk_error(exc, self.root) from None

    # -- housekeeping -----------------------------------------------------------------
    def new_build_dir(self, label: str) -> Path:
        """A fresh private staging directory for a build (removed by the caller)."""
        self.ensure()
        return Path(tempfile.mkdtemp(prefix=f"build-{label}-", dir=self.root / "tmp"))

    def log_path(self, label: str) -> Path:
        self.ensure()
        return self.root / "logs" / f"{label}.log"

    def _sweep_tmp(self) -> None:
        """Remove staging directories left by processes that were killed long ago."""
        now = time.time()
        try:
            children = list((self.root / "tmp").iterdir())
        except OSError:
            return
        for child in children:
            try:
                if now - child.stat().st_mtime > _STALE_TMP_SECONDS:
                    shutil.rmtree(child, ignore_errors=True)
            except OSError:
                pass


def check_private_dir(path: Path, st: os.stat_result) -> None:
    """Refuse a cache directory owned by someone else or writable by others."""
    if st.st_uid != os.getuid():
        raise CacheError(
            f"the cache directory {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
            f"loading from it would run their code. Set OPSMITH_CACHE_DIR to a directory of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(
            f"the cache directory {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"they could replace the code you load. Run: chmod 700 {path}")


def _parse_manifest(raw: bytes, key: str) -> dict[str, Any] | None:
    try:
        manifest = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT \
            or manifest.get("key") != key or not isinstance(manifest.get("files"), dict):
        return None
    return manifest


def _verify_files(path: Path, manifest: dict[str, Any]) -> str | None:
    for fname, info in manifest["files"].items():
        fpath = path / fname
        try:
            size = fpath.stat().st_size
        except OSError:
            return f"{fname} is missing"
        if size != info.get("size"):
            return f"{fname} has {size} bytes, expected {info.get('size')}"
        if file_sha256(fpath) != info.get("sha256"):
            return f"{fname} does not match its sha256"
    return None


def _stamp(st: os.stat_result) -> list[int]:
    # ctime cannot be set by utime(): any write to the file moves it.
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _write_stamps(path: Path, manifest: dict[str, Any]) -> None:
    """Remember each file's stat stamp after its bytes were hashed (see _verify_stamped)."""
    try:
        stamps = {f: _stamp(os.stat(path / f)) for f in manifest["files"]}
        tmp = path / f".{STAMPS}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps(stamps))
        os.replace(tmp, path / STAMPS)
    except OSError:
        pass  # without stamps the next read re-hashes: slower, never wrong


def _verify_stamped(path: Path, manifest: dict[str, Any]) -> str | None:
    """Verify an entry, re-hashing only files whose stat stamp moved since they were hashed.

    Hashing a large artifact on every warm load costs milliseconds; a file whose size,
    mtime, ctime and inode are those recorded right after its sha256 was checked has not
    been written since. Any write (truncation, a flipped byte, a replacement) moves ctime,
    so it is re-hashed and a mismatch is caught before the file is loaded.
    """
    try:
        stamps = json.loads((path / STAMPS).read_bytes())
    except (OSError, ValueError):
        stamps = {}
    rehash = []
    for fname in manifest["files"]:
        try:
            st = os.stat(path / fname)
        except OSError:
            return f"{fname} is missing"
        if not isinstance(stamps, dict) or stamps.get(fname) != _stamp(st):
            rehash.append(fname)
    if not rehash:
        return None
    problem = _verify_files(path, {"files": {f: manifest["files"][f] for f in rehash}})
    if problem is None:
        _write_stamps(path, manifest)
    return problem


def _record_use(path: Path) -> None:
    try:
        fd = os.open(path / USES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)
    except OSError:
        pass  # statistics only: a full disk must not fail a load


def _du(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


def _disk_error(exc: OSError, root: Path) -> CacheError | OSError:
    if exc.errno == errno.ENOSPC:
        return CacheError(f"no space left on the device holding the cache {root}. Free space with "
                          f"`opsmith cache prune --max-size 2G` or set OPSMITH_CACHE_DIR elsewhere.")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CacheError(f"cannot write to the cache {root}: {exc.strerror}. Fix its permissions "
                          f"or set OPSMITH_CACHE_DIR to a writable directory.")
    return exc


_STORES: dict[str, LocalStore] = {}


def open_store(root: str | os.PathLike | None = None) -> LocalStore:
    """The store at ``root`` (default: ``settings.cache_dir``), one object per root per process."""
    if root is None:
        from opsmith._config import settings
        root = settings.cache_path
    key = os.path.abspath(os.fspath(root))
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = LocalStore(key)
    return store
