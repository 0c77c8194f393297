"""Shared fixtures: a fresh cache directory for every test, and the `gpu` marker's skip hook."""
from __future__ import annotations

import contextlib
import functools
import os
import shutil

import pytest


@functools.lru_cache(maxsize=1)
def _gpu_absent_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords:
            reason = _gpu_absent_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache directory (and no inherited opsmith variables)."""
    cache = tmp_path / "opsmith-cache"
    for var in list(os.environ):
        if var.startswith("OPSMITH_") or var == "TORCH_EXTENSIONS_DIR":
            monkeypatch.delenv(var)
    monkeypatch.setenv("OPSMITH_CACHE_DIR", str(cache))
    from opsmith._config import reset
    reset()
    yield cache
    reset()
    stop_background_pch(cache)


def stop_background_pch(cache) -> list[int]:
    """Stop the detached precompiled-header builds (``python -m opsmith._build._pch``, and the compiler
    in their process group) that a test started into its own cache ``cache``: they outlive the test,
    build into a directory about to be deleted, and on CI's 2 cores slowed the tests after them (a
    run with several left over took 1,705 s instead of about 900). Linux (/proc); returns their pids."""
    import signal
    from pathlib import Path
    proc, needle, stopped = Path("/proc"), os.fsencode(str(cache)), []
    if not proc.is_dir():
        return stopped
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"opsmith._build._pch" not in cmd or needle not in cmd:
            continue
        pid = int(d.name)
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:  # its own group (process_group=0): the compiler goes with it
                os.killpg(pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    return stopped


def have_tool(name: str) -> bool:
    return shutil.which(name) is not None


@contextlib.contextmanager
def cache_dir(path):
    """OPSMITH_CACHE_DIR set to ``path`` inside the block (a module-scoped fixture's own cache,
    which outlives the per-test one), restored after."""
    from opsmith._cache import _open
    old = os.environ.get("OPSMITH_CACHE_DIR")
    os.environ["OPSMITH_CACHE_DIR"] = str(path)
    _open.reset()
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("OPSMITH_CACHE_DIR", None)
        else:
            os.environ["OPSMITH_CACHE_DIR"] = old
        _open.reset()
