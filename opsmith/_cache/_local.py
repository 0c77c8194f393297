"""The local artifact store: entries as directories under ``<root>/entries``.

Layout (the only code that knows it)::

    entries/<key>/manifest.json   kind, name, sha256 and size of every file, metadata
    entries/<key>/<files>         the artifacts (a .so, an object file, a cubin, ...)
    entries/<key>/uses            one byte appended per hit (its size is the hit count)
    entries/<key>/verified        stat stamps of the files when their sha256 was last checked
    tmp/put-*                     staging; an entry appears only by os.replace

The root is private (0700) and owned by the user; entries owned by another user are refused.
A root on a read-only filesystem serves hits and refuses puts with a clear error.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opsmith._cache._keys import file_sha256
from opsmith._cache._root import disk_error, ensure_root, require_writable
from opsmith._cache._stamps import stamp_of
from opsmith._cache._store import Entry, EntryInfo, Store
from opsmith._errors import CacheError

__all__ = ["LocalStore"]

log = logging.getLogger("opsmith.cache")

MANIFEST = "manifest.json"
USES = "uses"
STAMPS = "verified"
DIGEST = "manifest_sha256"
_FORMAT = 1


class LocalStore(Store):
    """A store in a private directory on the local filesystem."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(os.fspath(root)))
        self._writable: bool | None = None

    # -- safety ---------------------------------------------------------------------
    def ensure(self) -> None:
        """Open the root (created 0700 if missing; refused if unsafe). A read-only root is
        accepted: hits are served from it, a put raises a clear error."""
        if self._writable is None:
            self._writable = ensure_root(self.root)
            if self._writable:
                for sub in ("entries", "tmp"):
                    (self.root / sub).mkdir(mode=0o700, exist_ok=True)

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

    def record_use(self, key: str) -> None:
        _record_use(self._entry_dir(key))

    def use_counter(self, key: str) -> str | None:
        return os.fspath(self._entry_dir(key) / USES)

    # -- put ------------------------------------------------------------------------
    def put(self, key: str, files: Mapping[str, str | os.PathLike], *, kind: str, name: str = "",
            meta: Mapping[str, Any] | None = None, move: bool = False) -> Entry:
        import shutil
        import tempfile
        self.ensure()
        require_writable(self.root, f"publish the cache entry {key[:16]}")
        final = self._entry_dir(key)
        try:
            stage = Path(tempfile.mkdtemp(prefix=f"put-{key[:12]}-", dir=self.root / "tmp"))
        except OSError as exc:
            raise disk_error(exc, self.root) from None
        from opsmith._cache._faults import point  # the fault suite's pauses (cold path only)
        try:
            point("put:staged")
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
            point("put:copied")
            manifest = {"format": _FORMAT, "key": key, "kind": kind, "name": name,
                        "created": time.time(), "files": listing, "meta": dict(meta or {})}
            manifest[DIGEST] = _manifest_digest(manifest)
            (stage / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            os.chmod(stage, 0o700)
            point("put:manifest")
            try:
                os.replace(stage, final)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                existing = self.get(key, record_use=False)
                if existing is not None:  # another process published the same key first
                    return existing
                os.replace(stage, final)  # the corrupt one was removed by get()
            point("put:replaced")
            _write_stamps(final, manifest)
            return Entry(key, final, manifest)
        except OSError as exc:
            raise disk_error(exc, self.root) from None
        finally:
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)

    # -- list / remove ----------------------------------------------------------------
    def list(self) -> Iterator[EntryInfo]:
        self.ensure()
        try:
            paths = sorted((self.root / "entries").iterdir())
        except FileNotFoundError:
            return
        for path in paths:
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
        import shutil
        import uuid
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


def _parse_manifest(raw: bytes, key: str) -> dict[str, Any] | None:
    try:
        manifest = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT \
            or manifest.get("key") != key or not isinstance(manifest.get("files"), dict):
        return None
    try:
        if manifest.get(DIGEST) != _manifest_digest(manifest):
            return None  # a changed byte: the files' stamps cannot see it, this does
    except (TypeError, ValueError):
        return None
    return manifest


def _manifest_digest(manifest: dict[str, Any]) -> str:
    """The sha256 of everything in a manifest that decides what is loaded.

    The file stamps let ``get`` skip re-hashing unchanged files, but they do not cover the
    manifest itself: without this a flipped bit in a file's recorded sha256, in ``meta`` (the
    artifact's file name, a kernel's lowered names) or in ``kind`` would pass unseen.
    ``created`` is left out: it only orders pruning, and ``opsmith cache`` tooling edits it.
    """
    import hashlib
    body = {k: v for k, v in manifest.items() if k not in (DIGEST, "created")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


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


def _write_stamps(path: Path, manifest: dict[str, Any]) -> None:
    """Remember each file's stat stamp after its bytes were hashed (see _verify_stamped)."""
    try:
        stamps = {f: stamp_of(os.stat(path / f)) for f in manifest["files"]}
        import uuid
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
        if not isinstance(stamps, dict) or stamps.get(fname) != stamp_of(st):
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
