"""Triton's compiled C stubs through opsmith's store (opsmith.compile_cache._triton_stubs).

CI has no Triton, so a stand-in package named ``triton`` is put on ``sys.path``: its
``triton.runtime.build._build`` has Triton's parameters and really compiles the C source with
the host compiler (counting its compiles), and ``triton.backends.nvidia.driver`` imports it by
name as Triton's driver does. The real Triton runs in the GPU benchmark
(bench/bench_compile_cache.py, counters ``triton-stub``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opsmith._cache._open import open_cache
from opsmith.compile_cache import _triton_stubs
from opsmith.compile_cache._backend import CompileCache

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler on PATH (cc, gcc or clang)")

BUILD = '''
import os, subprocess, sysconfig
COMPILES = []
def _build(name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs):
    so = os.path.join(srcdir, name + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.check_call([{cc!r}, src, "-O2", "-shared", "-fPIC", "-o", so])
    COMPILES.append(name)
    return so
'''
DRIVER = "from triton.runtime.build import _build\n"


def _fake_triton(root: Path, params: str = "name, src, srcdir, library_dirs, include_dirs, libraries") -> None:
    pkg = root / "triton"
    (pkg / "runtime").mkdir(parents=True)
    (pkg / "backends" / "nvidia").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0-test'\n")
    for sub in ("runtime", "backends", "backends/nvidia"):
        (pkg / sub / "__init__.py").write_text("")
    build = BUILD.format(cc=CC or "cc")
    if params != "name, src, srcdir, library_dirs, include_dirs, libraries":
        build = build.replace("name, src, srcdir, library_dirs, include_dirs, libraries, *rest, **kwargs", params)
    (pkg / "runtime" / "build.py").write_text(build)
    (pkg / "backends" / "nvidia" / "driver.py").write_text(DRIVER)


def _hide_real_triton(monkeypatch) -> None:
    """A real Triton already imported (torch may import it) is set aside for the test."""
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)


def _drop_fake_triton() -> None:
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        del sys.modules[name]


@pytest.fixture
def triton(tmp_path, monkeypatch):
    """The stand-in Triton, imported; removed from sys.modules (and unhooked) afterwards,
    and a real Triton imported before put back (monkeypatch's undo runs after this)."""
    _hide_real_triton(monkeypatch)
    _fake_triton(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    import triton.backends.nvidia.driver as driver
    import triton.runtime.build as build
    assert build.__file__.startswith(str(tmp_path)), build.__file__
    yield build, driver
    _triton_stubs.uninstall()
    _drop_fake_triton()


def _source(tmp_path: Path, body: str = "int stub_answer(void) { return 42; }\n") -> str:
    src = tmp_path / "src" / "main.c"
    src.parent.mkdir(exist_ok=True)
    src.write_text(textwrap.dedent(body))
    return str(src)


def _call(driver, tmp_path: Path, src: str, where: str) -> Path:
    out = tmp_path / where
    out.mkdir()
    return Path(driver._build("cuda_utils", src, str(out), ["/usr/lib"], ["/usr/include"], ["m"]))


def _owner(root: Path) -> CompileCache:
    return CompileCache(open_cache(root), wait=5.0)


@needs_cc
def test_a_stub_compiles_once_then_comes_from_the_store(triton, tmp_path):
    build, driver = triton
    owner = _owner(tmp_path / "cache")
    assert _triton_stubs.install(owner)
    assert driver._build is build._build and driver._build.__wrapped__ is not None
    src = _source(tmp_path)
    first = _call(driver, tmp_path, src, "a")
    assert build.COMPILES == ["cuda_utils"]
    second = _call(driver, tmp_path, src, "b")
    assert build.COMPILES == ["cuda_utils"], "a stub in the store compiled again"
    assert second.read_bytes() == first.read_bytes() and second.name == first.name
    counts = owner.counters.totals()["triton-stub"]
    assert (counts["compiles"], counts["puts"], counts["hits"], counts["misses"]) == (1, 1, 1, 1)


@needs_cc
def test_a_new_node_takes_the_stub_from_an_imported_bundle(triton, tmp_path):
    build, driver = triton
    src = _source(tmp_path)
    _triton_stubs.install(_owner(tmp_path / "node-a"))
    _call(driver, tmp_path, src, "a")
    _triton_stubs.uninstall()
    bundle = tmp_path / "stubs.bundle"
    key = tmp_path / "cluster.key"
    key.write_text("ab" * 32)
    key.chmod(0o600)
    env = dict(os.environ, OPSMITH_REMOTE_KEY_FILE=str(key))
    for cache, cmd in (("node-a", ["export", str(bundle), "--kind", "torch-compile"]), ("node-b", ["import", str(bundle)])):
        subprocess.run([sys.executable, "-m", "opsmith", "--cache-dir", str(tmp_path / cache), "cache", *cmd],
                       env=env, check=True, capture_output=True)
    _triton_stubs.install(_owner(tmp_path / "node-b"))
    _call(driver, tmp_path, src, "b")
    assert build.COMPILES == ["cuda_utils"]


@needs_cc
def test_a_changed_source_or_library_list_is_a_miss(triton, tmp_path):
    build, driver = triton
    _triton_stubs.install(_owner(tmp_path / "cache"))
    src = _source(tmp_path)
    _call(driver, tmp_path, src, "a")
    _source(tmp_path, "int stub_answer(void) { return 43; }\n")
    _call(driver, tmp_path, src, "b")
    out = tmp_path / "c"
    out.mkdir()
    driver._build("cuda_utils", src, str(out), ["/usr/lib"], ["/usr/include"], ["m", "dl"])
    assert build.COMPILES == ["cuda_utils"] * 3


@needs_cc
def test_uninstall_gives_triton_its_builder_back(triton, tmp_path):
    build, driver = triton
    original = build._build
    _triton_stubs.install(_owner(tmp_path / "cache"))
    assert build._build is not original and driver._build is not original
    _triton_stubs.uninstall()
    assert build._build is original and driver._build is original


def test_a_triton_with_another_builder_is_named_and_left_alone(tmp_path, monkeypatch, caplog):
    _hide_real_triton(monkeypatch)
    _fake_triton(tmp_path / "site", params="name, src, out_dir, library_dirs, include_dirs, libraries")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    try:
        import triton.runtime.build as build
        original = build._build
        (problem,) = _triton_stubs.problems()
        assert "triton.runtime.build._build" in problem and "out_dir" in problem
        with caplog.at_level("WARNING", logger="opsmith.compile_cache"):
            assert not _triton_stubs.install(_owner(tmp_path / "cache"))
        assert "compile on each machine" in caplog.text
        assert build._build is original
    finally:
        _drop_fake_triton()


def test_a_lookup_never_imports_triton(tmp_path, monkeypatch):
    _hide_real_triton(monkeypatch)
    owner = _owner(tmp_path / "cache")
    assert owner.get("fx-graph", "pt2:fx-graph-v1::" + "a" * 52 + ":c1") is None
    assert "triton" not in sys.modules and not owner._stubs_hooked


@needs_cc
def test_must_hit_does_not_refuse_a_stub(triton, tmp_path, monkeypatch):
    """A stub is Triton's per-machine C, not a graph: OPSMITH_MUST_HIT=1 lets it compile."""
    build, driver = triton
    monkeypatch.setenv("OPSMITH_MUST_HIT", "1")
    _triton_stubs.install(_owner(tmp_path / "cache"))
    _call(driver, tmp_path, _source(tmp_path), "a")
    assert build.COMPILES == ["cuda_utils"]
