"""Shared fixtures: a fresh cache directory for every test (and the background PCH builds a test or a module's
fixtures left stopped), the `gpu` marker's skip hook, and the package tests' wheels, built once a session."""
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
    stop_background_pch(tmp_path)  # the fresh cache's, and those of caches a test made beside it (tmp_path / "cache")


@pytest.fixture(autouse=True, scope="module")
def _stop_fixtures_background_pch(tmp_path_factory):
    """After a module's tests: the background PCH builds that its module- and session-scoped fixtures' caches started
    (``tmp_path_factory``'s folders; nothing else runs then)."""
    yield
    stop_background_pch(tmp_path_factory.getbasetemp())


def stop_background_pch(cache) -> list[int]:
    """Stop the detached precompiled-header builds (``python -m opsmith._build._pch``, and the compiler
    in their process group) that a test started into its own cache ``cache`` (or a cache inside that folder): they
    outlive the test, build into a directory about to be deleted, and on CI's 2 cores slowed the tests after them (a
    run with several left over took 1,705 s instead of about 900). Linux (/proc); returns their pids."""
    import signal
    from pathlib import Path
    proc, stopped = Path("/proc"), []
    needles = (os.fsencode(str(cache)) + b'"', os.fsencode(os.path.join(str(cache), "")))  # the folder, or inside it
    if not proc.is_dir():
        return stopped
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"opsmith._build._pch" not in cmd or not any(n in cmd for n in needles):
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


# -- the wheels tests/package's two modules share, each built once a session (building opsmith.ops' programs for an
# arch is minutes on CI's 2 cores; test_package.py and test_torch_versions.py install the same two wheels)
def _package(args, cwd, env) -> dict:
    """``opsmith package ARGS --json`` in ``cwd``; its JSON (the test fails with the output where it fails)."""
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "opsmith", "package", *args, "--json"], cwd=cwd, capture_output=True,
                       text=True, env={**os.environ, **env}, timeout=900, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="session")
def relu_package(tmp_path_factory):
    """{"tmp": its folder, "src": the package's sources, "env": the cache it was built from, "out": the JSON of
    ``opsmith package relupkg --arch sm_80,sm_90``}."""
    from pathlib import Path
    tmp = tmp_path_factory.mktemp("relupkg")
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "package_relu", tmp / "src")
    env = {"OPSMITH_CACHE_DIR": str(tmp / "cache")}
    out = _package(["relupkg", "-o", str(tmp / "a"), "--arch", "sm_80,sm_90"], tmp / "src", env)
    return {"tmp": tmp, "src": tmp / "src", "env": env, "out": out}


@pytest.fixture(scope="session")
def ops_package(tmp_path_factory):
    """The JSON of ``opsmith package --ops --arch sm_90 --no-ptx``: opsmith.ops' programs, a file and a dtype each."""
    tmp = tmp_path_factory.mktemp("opspkg")
    return _package(["--ops", "-o", str(tmp / "w"), "--arch", "sm_90", "--no-ptx"], tmp,
                    {"OPSMITH_CACHE_DIR": str(tmp / "cache")})
