"""The warm index: an exact repeat of a ``load`` call, answered by ``stat`` alone.

The full lookup of a built extension re-derives the plan (spec, toolchain, flags, unit keys)
and imports the build modules to do it: about 5 ms of a warm load on the GPU machine. The
warm index remembers, per call — its arguments, every setting, the environment variables
that steer a build, Python, torch and the visible GPUs — the artifact it gave and the stat
stamps (size, mtime, ctime, inode) of every file that answer rests on: the sources, their
own headers, the compilers, torch's headers and the artifact itself. When all stamps are
unchanged the artifact is loaded at once. Any change (an edit, a fresh checkout, a new
compiler, a pruned entry) is a miss, and the full lookup runs — which still compiles
nothing when only stamps moved. ctime cannot be set by a user, so an edit that restores
size and mtime is still seen.

It lives in the machine-local state (:class:`~opsmith._cache._state.State`, namespace
``warm``), written atomically, read only from a cache directory owned by the user and not
writable by others.
"""
from __future__ import annotations

import hashlib
import os
import stat
import sys
from typing import Any

from opsmith._cache._stamps import stamp, unchanged
from opsmith._config import settings
from opsmith._toolchain._gpus import gpu_fingerprint
from opsmith._version import __version__

__all__ = ["call_key", "lookup", "remember", "gpu_fingerprint", "Hit"]

NAMESPACE = "warm"
# Environment variables a build reads besides opsmith's settings (compiler discovery).
_ENV = ("PATH", "CC", "CXX", "CUDA_HOME", "CUDA_PATH", "CUDACXX", "TORCH_CUDA_ARCH_LIST",
        "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


class Hit:
    """An artifact found by the warm index (the fields ``load_artifact`` needs)."""

    __slots__ = ("name", "kind", "path", "key", "init_names")

    def __init__(self, name: str, kind: str, path: str, key: str, init_names: tuple[str, ...]) -> None:
        self.name, self.kind, self.path, self.key, self.init_names = name, kind, path, key, init_names


def _root(build_directory) -> str:
    if build_directory is not None:
        return os.path.abspath(os.fspath(build_directory))
    return os.fspath(settings.cache_path)


def call_key(kind: str, args: tuple) -> str | None:
    """The index key of one call (None when an argument has no stable text form)."""
    torch = sys.modules.get("torch")
    parts = [("opsmith-warm", 1, __version__), kind, args,
             tuple((s.name, getattr(settings, s.name)) for s in settings.describe()),
             tuple((v, os.environ.get(v)) for v in _ENV),
             (sys.executable, sys.version, getattr(sys, "abiflags", "")),
             (getattr(torch, "__version__", None), getattr(torch, "__file__", None)),
             gpu_fingerprint()]
    text = repr(parts)
    if " at 0x" in text:  # an object repr with an address: not the same call next time
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _private(root: str) -> bool:
    try:
        st = os.stat(root)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def lookup(key: str | None, build_directory=None) -> Hit | None:
    """The artifact this exact call gave last time, if nothing it rests on has changed."""
    if key is None:
        return None
    from opsmith._cache._state import State
    root = _root(build_directory)
    rec = State(root).get(NAMESPACE, key)
    if rec is None or not _private(root):
        return None  # the full lookup explains what is wrong with the directory
    try:
        for s in rec["stamps"]:
            if not unchanged(s[0], s[1:]):
                return None
        hit = Hit(rec["name"], rec["kind"], rec["path"], rec["key"], tuple(rec["init_names"]))
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    _count_use(rec.get("uses"), root, hit.key)  # so that `opsmith cache prune` keeps what is used
    return hit


def _count_use(counter, root: str, key: str) -> None:
    if isinstance(counter, str) and counter:  # the file the store named when the call was recorded
        try:
            fd = os.open(counter, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, b".")
            finally:
                os.close(fd)
            return
        except OSError:
            pass  # gone (pruned) or read-only: let the store decide
    from opsmith._cache._open import open_store
    try:
        open_store(root).record_use(key)
    except Exception:  # noqa: BLE001 - statistics only: never fail a load
        pass


def remember(key: str | None, artifact: Any, init_names: tuple[str, ...], build_directory=None) -> None:
    """Record ``artifact`` (with its ``inputs``) as this call's answer. Never fails a load."""
    if key is None or not getattr(artifact, "inputs", None):
        return
    try:
        from opsmith._cache._state import State
        stamps = [[p, *stamp(p)] for p in (os.fspath(artifact.path), *dict.fromkeys(artifact.inputs))]
        from opsmith._cache._open import open_store
        root = _root(build_directory)
        State(root).put(NAMESPACE, key, {
            "name": artifact.name, "kind": artifact.kind, "path": os.fspath(artifact.path),
            "key": artifact.key, "init_names": list(init_names), "stamps": stamps,
            "uses": open_store(root).use_counter(artifact.key)})
    except Exception as exc:  # noqa: BLE001 - an optimisation only: a full disk must not fail a load
        import logging
        logging.getLogger("opsmith").debug("warm index not written: %s", exc)
