"""Build workspaces: private temporary build directories, build logs, and stable paths.

Builds run in ``<root>/tmp/build-*`` (removed by the caller; those of processes killed long
ago are swept), keep their logs in ``<root>/logs`` for error messages, and use a few
directories whose paths never change (``pch-src``: the header a PCH is built from, whose
path clang records; ``module-names``: generated headers).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from opsmith._cache._root import disk_error, require_writable

__all__ = ["Workspace"]

_STALE_TMP_SECONDS = 3600.0


class Workspace:
    """The build directories and logs of one cache directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(os.fspath(root)))

    def _dir(self, name: str, what: str) -> Path:
        require_writable(self.root, what)
        d = self.root / name
        try:
            d.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise disk_error(exc, self.root) from None
        return d

    def build_dir(self, label: str) -> Path:
        """A fresh private directory for one build (the caller removes it)."""
        import tempfile
        tmp = self._dir("tmp", "build")
        self.sweep()
        try:
            return Path(tempfile.mkdtemp(prefix=f"build-{label}-", dir=tmp))
        except OSError as exc:
            raise disk_error(exc, self.root) from None

    def staging_dir(self) -> Path:
        """The directory where stores stage entries before ``os.replace`` publishes them."""
        return self._dir("tmp", "publish an entry")

    def log_path(self, label: str) -> Path:
        """Where the log of build ``label`` is kept."""
        return self._dir("logs", "build") / f"{label}.log"

    def stable_dir(self, name: str) -> Path:
        """A directory under the cache whose path never changes (``pch-src``, ``module-names``)."""
        return self._dir(name, "build")

    def sweep(self) -> None:
        """Remove build and staging directories left by processes killed long ago."""
        import shutil
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
