"""The warm index: an exact repeat of a load() call is answered by stat alone, and any change
to what the answer rests on falls back to the full lookup (real compiler, real files)."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time

import pytest

import opsmith
from opsmith._torch import _warm as _memo

LIB = 'extern "C" int opsmith_answer() { return VALUE; }\n'

# A fresh process: load, then report the answer and whether the build modules were imported.
CHILD = r'''
import ctypes, json, sys
import opsmith
path = opsmith.load("memo_lib", [sys.argv[1]], extra_cflags=["-DVALUE=" + sys.argv[2]],
                    extra_include_paths=[sys.argv[3]], is_python_module=False)
print(json.dumps({"answer": ctypes.CDLL(path).opsmith_answer(),
                  "full_lookup": "opsmith._build._engine" in sys.modules}))
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSMITH_PCH", "0")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "extra.h").write_text("#define EXTRA 0\n")
    src = tmp_path / "lib.cpp"
    src.write_text('#include "extra.h"\n' + LIB)
    return src, inc


def _child(src, inc, value="3"):
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    p = subprocess.run([sys.executable, "-c", CHILD, str(src), value, str(inc)], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _rewrite(path, text=None):
    data = path.read_bytes() if text is None else text.encode()
    path.unlink()  # a fresh checkout: new inode and mtime
    path.write_bytes(data)
    later = time.time_ns() + 2 * 10**9
    os.utime(path, ns=(later, later))


def test_repeat_load_skips_the_build_modules(project):
    src, inc = project
    assert _child(src, inc) == {"answer": 3, "full_lookup": True}   # builds, records the call
    assert _child(src, inc) == {"answer": 3, "full_lookup": False}  # warm index: stat only
    # Another call (a different flag) is another entry of the index.
    assert _child(src, inc, "4") == {"answer": 4, "full_lookup": True}
    assert _child(src, inc, "4") == {"answer": 4, "full_lookup": False}


def test_edits_and_fresh_checkouts_fall_back_to_the_full_lookup(project):
    src, inc = project
    _child(src, inc)
    _rewrite(src)  # identical bytes, new stamp: full lookup (which compiles nothing), index refreshed
    assert _child(src, inc) == {"answer": 3, "full_lookup": True}
    assert _child(src, inc) == {"answer": 3, "full_lookup": False}
    _rewrite(inc / "extra.h", "#define EXTRA 1\n")  # a header the source includes changed
    assert _child(src, inc) == {"answer": 3, "full_lookup": True}
    _rewrite(src, '#include "extra.h"\n' + LIB.replace("VALUE", "VALUE + 10"))
    assert _child(src, inc) == {"answer": 13, "full_lookup": True}
    assert _child(src, inc) == {"answer": 13, "full_lookup": False}


def test_settings_and_environment_are_part_of_the_call(project, monkeypatch):
    src, inc = project
    args = ("memo_lib", (str(src),), None)
    k = _memo.call_key("load", args)
    with monkeypatch.context() as m:
        m.setenv("OPSMITH_OPT_LEVEL", "-O2")
        assert _memo.call_key("load", args) != k
    with monkeypatch.context() as m:  # CXX may be set already (the GPU machine sets it)
        m.setenv("CXX", "/no/such/compiler")
        assert _memo.call_key("load", args) != k
    assert _memo.call_key("load", args) == k  # both restored: the same call again
    assert _memo.call_key("load", (object(),)) is None  # no stable text: never indexed


def test_damaged_index_or_removed_entry_is_a_miss_not_an_error(project, fresh_cache):
    src, inc = project
    _child(src, inc)
    (record,) = (fresh_cache / "records" / "warm").iterdir()
    record.write_text("{not json")
    assert _child(src, inc) == {"answer": 3, "full_lookup": True}
    rec = json.loads(record.read_text())
    entry = os.path.dirname(rec["path"])
    subprocess.run(["rm", "-rf", entry], check=True)  # e.g. `opsmith cache clear`
    assert _child(src, inc) == {"answer": 3, "full_lookup": True}  # rebuilt, not a crash
    assert _child(src, inc) == {"answer": 3, "full_lookup": False}


def test_in_process_reload_after_edit_gets_new_code(project):
    src, inc = project
    p1 = opsmith.load("memo_inproc", [str(src)], extra_cflags=["-DVALUE=1"], extra_include_paths=[str(inc)],
                      is_python_module=False)
    assert ctypes.CDLL(p1).opsmith_answer() == 1
    _rewrite(src, '#include "extra.h"\n' + LIB.replace("VALUE", "VALUE + 1"))
    p2 = opsmith.load("memo_inproc", [str(src)], extra_cflags=["-DVALUE=1"], extra_include_paths=[str(inc)],
                      is_python_module=False)
    assert p2 != p1 and ctypes.CDLL(p2).opsmith_answer() == 2


def test_index_in_a_shared_directory_is_not_trusted(project, fresh_cache):
    src, inc = project
    _child(src, inc)
    os.chmod(fresh_cache, 0o777)
    try:
        assert _memo.lookup(next(iter(_keys(fresh_cache)))) is None
    finally:
        os.chmod(fresh_cache, 0o700)


def _keys(cache):
    return [p.stem for p in (cache / "records" / "warm").iterdir()]


def test_warm_hits_are_counted_without_importing_the_store(tmp_path, fresh_cache):
    """`opsmith cache prune` keeps what is used: a warm hit appends to the counter file the store
    named when the call was recorded, and imports no store module to do it."""
    src = tmp_path / "counted.cpp"
    src.write_text('extern "C" int counted() { return 1; }\n')
    code = ("import json, sys, opsmith\n"
            f"opsmith.load('counted', [{str(src)!r}], is_python_module=False)\n"
            "print(json.dumps('opsmith._cache._store' in sys.modules))\n")
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(fresh_cache))
    seen = []
    for _ in range(4):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        seen.append(json.loads(out.stdout.strip().splitlines()[-1]))
    # the first builds; the second records the call as made without torch imported (the call
    # key says whether it was); the last two are warm hits that never imported the store
    assert seen[2:] == [False, False]
    from opsmith._cache._open import open_cache
    (info,) = [e for e in open_cache().store.list() if e.name == "counted"]
    assert info.hits >= 2
