"""A second store backend (tests/blob_store.py, another layout) runs real builds end to end:
no caller of the Store interface depends on LocalStore's ``entries/<key>/`` layout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import opsmith
from opsmith._errors import ConfigError

HERE = Path(__file__).resolve().parents[1]  # tests/

LIB = 'extern "C" int answer() { return 42; }\n'


@pytest.fixture
def blob_backend(monkeypatch, fresh_cache):
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("OPSMITH_STORE_BACKEND", "blob_store:BlobStore")
    from opsmith._cache._open import reset
    reset()
    yield fresh_cache
    reset()


def test_backend_is_chosen_by_the_setting(blob_backend):
    from opsmith._cache._open import open_store
    from blob_store import BlobStore
    assert isinstance(open_store(), BlobStore)


def test_a_library_builds_loads_and_hits_through_the_second_backend(blob_backend, tmp_path):
    import ctypes
    src = tmp_path / "answer.cpp"
    src.write_text(LIB)
    art = opsmith.build_shared_library("answer", [str(src)])
    assert art.built and ctypes.CDLL(str(art.path)).answer() == 42
    again = opsmith.build_shared_library("answer", [str(src)])
    assert not again.built and again.key == art.key
    assert (blob_backend / "blobstore" / "manifests" / f"{art.key}.json").exists()
    assert not (blob_backend / "entries").exists()  # nothing went through LocalStore's layout


def test_the_warm_index_and_a_fresh_process_use_the_second_backend(blob_backend, tmp_path):
    src = tmp_path / "answer.cpp"
    src.write_text(LIB)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    code = ("import json, opsmith\n"
            f"p = opsmith.load('answer', [{str(src)!r}], is_python_module=False)\n"
            "import ctypes; print(json.dumps({'path': p, 'v': ctypes.CDLL(p).answer()}))\n")
    outs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1] and outs[0]["v"] == 42
    assert "/blobstore/views/" in outs[0]["path"]
    assert not (blob_backend / "entries").exists()


def test_cache_admin_works_on_the_second_backend(blob_backend, tmp_path):
    from opsmith._cache import _admin
    from opsmith._cache._open import open_cache
    src = tmp_path / "answer.cpp"
    src.write_text(LIB)
    art = opsmith.build_shared_library("answer", [str(src)])
    cache = open_cache()
    checked, problems = _admin.verify(cache)
    assert checked >= 1 and not problems
    assert any(e.key == art.key for e in _admin.entries(cache))
    result = _admin.clear(cache)
    assert not list(cache.store.list()) and result.removed


def test_a_bad_backend_setting_names_the_variable(monkeypatch, fresh_cache):
    from opsmith._cache._open import open_store, reset
    for value, match in [("nocolon", "module:Class"), ("no_such_mod:X", "cannot import"),
                         ("json:JSONDecoder", "not a subclass")]:
        monkeypatch.setenv("OPSMITH_STORE_BACKEND", value)
        reset()
        with pytest.raises(ConfigError, match=match):
            open_store()
    reset()
