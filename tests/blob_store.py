"""A second artifact-store backend, for tests: content-addressed blobs and a manifest per key.

Layout (unlike LocalStore's ``entries/<key>/``)::

    blobs/<sha256>             every file once, by content
    manifests/<key>.json       the manifest (files -> sha256, size), written by os.replace
    views/<key>/<name>         hard links to the blobs under the entry's file names, made on get

If any caller of the Store interface relied on LocalStore's layout, the tests that run with
``OPSMITH_STORE_BACKEND=blob_store:BlobStore`` would fail.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from opsmith._cache._store import Entry, EntryInfo, Store
from opsmith._errors import CacheError


def _sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class BlobStore(Store):
    def __init__(self, root) -> None:
        self.root = Path(root) / "blobstore"

    def _dirs(self):
        for d in ("blobs", "manifests", "views", "tmp"):
            (self.root / d).mkdir(parents=True, exist_ok=True, mode=0o700)

    def _manifest(self, key):
        try:
            return json.loads((self.root / "manifests" / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def get(self, key, *, record_use=True):
        man = self._manifest(key)
        if man is None:
            return None
        if self.verify(key) is not None:
            self.remove(key)
            return None
        view = self.root / "views" / key
        if not view.is_dir():
            self._dirs()
            stage = Path(tempfile.mkdtemp(dir=self.root / "tmp"))
            for name, info in man["files"].items():
                os.link(self.root / "blobs" / info["sha256"], stage / name)
            try:
                os.replace(stage, view)
            except OSError:
                shutil.rmtree(stage, ignore_errors=True)
        if record_use:
            self.record_use(key)
        return Entry(key, view, man)

    def put(self, key, files, *, kind, name="", meta=None, move=False):
        self._dirs()
        listing = {}
        for fname, src in files.items():
            if "/" in fname:
                raise CacheError(f"invalid file name {fname!r}")
            sha = _sha(src)
            blob = self.root / "blobs" / sha
            if not blob.exists():
                tmp = self.root / "tmp" / uuid.uuid4().hex
                shutil.copyfile(src, tmp)
                os.replace(tmp, blob)
            listing[fname] = {"sha256": sha, "size": blob.stat().st_size}
        man = {"key": key, "kind": kind, "name": name, "created": time.time(), "files": listing,
               "meta": dict(meta or {}), "uses": 0}
        tmp = self.root / "tmp" / uuid.uuid4().hex
        tmp.write_text(json.dumps(man))
        os.replace(tmp, self.root / "manifests" / f"{key}.json")
        if move:
            for src in files.values():
                try:
                    os.unlink(src)
                except OSError:
                    pass
        return self.get(key, record_use=False)

    def list(self):
        self._dirs()
        for m in sorted((self.root / "manifests").glob("*.json")):
            man = json.loads(m.read_text())
            last = (self.root / "uses" / m.stem).stat().st_mtime if (self.root / "uses" / m.stem).exists() \
                else man["created"]
            yield EntryInfo(m.stem, man["kind"], man["name"], sum(f["size"] for f in man["files"].values()),
                            man["created"], last, 0, self.root / "views" / m.stem)

    def remove(self, key):
        p = self.root / "manifests" / f"{key}.json"
        try:
            os.unlink(p)
        except FileNotFoundError:
            return False
        shutil.rmtree(self.root / "views" / key, ignore_errors=True)
        return True

    def verify(self, key):
        man = self._manifest(key)
        if man is None:
            return "no manifest"
        for name, info in man["files"].items():
            blob = self.root / "blobs" / info["sha256"]
            if not blob.exists() or _sha(blob) != info["sha256"]:
                return f"{name} does not match its sha256"
        return None

    def record_use(self, key):
        (self.root / "uses").mkdir(exist_ok=True)
        (self.root / "uses" / key).touch()
