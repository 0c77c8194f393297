"""opsmith._torch._native_lib: whether a native library serves, decided once, and, in a process
that uses an installed opsmith package, a library never built in this cache answered with one stat
(no build-engine lookup, no load) while one that was built is loaded."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conftest import cache_dir  # noqa: E402
from opsmith._build import _prebuilt  # noqa: E402
from opsmith._torch import _native_lib  # noqa: E402


@pytest.fixture
def packaged(monkeypatch):
    monkeypatch.setattr(_prebuilt, "active", lambda: True)  # as when an installed package serves


def _usable(state, loads, name="osm_test_lib"):
    return _native_lib.usable(state, True, lambda: loads.append(1), "the test library", "the fallback",
                              "OPSMITH_TEST", name)


def test_a_package_process_skips_a_library_never_built_here(packaged, tmp_path):
    with cache_dir(tmp_path / "cache"):
        loads: list = []
        state: dict = {}
        assert _usable(state, loads) is False and loads == []  # no lookup at all
        assert _usable(state, loads) is False and loads == []  # and remembered


def test_a_package_process_loads_a_library_built_here(packaged, tmp_path):
    with cache_dir(tmp_path / "cache"):
        _native_lib.mark_built("osm_test_lib")
        loads: list = []
        assert _usable({}, loads) is True and loads == [1]
        assert _usable({}, [], name="osm_other_lib") is False  # the mark is per library


def test_without_a_package_the_library_is_loaded_or_built(tmp_path, monkeypatch):
    monkeypatch.setattr(_prebuilt, "active", lambda: False)
    with cache_dir(tmp_path / "cache"):
        loads: list = []
        assert _usable({}, loads) is True and loads == [1]
