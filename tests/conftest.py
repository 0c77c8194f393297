"""Shared fixtures: a fresh cache directory for every test, and the `gpu` marker's skip hook."""
from __future__ import annotations

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


def have_tool(name: str) -> bool:
    return shutil.which(name) is not None
