"""The shared-library profile: a plain C/C++ library built, cached and called with no torch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import have_tool

pytestmark = pytest.mark.skipif(not (have_tool("c++") or have_tool("g++") or have_tool("clang++")),
                                reason="no C++ compiler on PATH")

LIB = r'''
#include <cstdint>
extern "C" int64_t opsmith_sum(const int64_t* xs, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; ++i) s += xs[i];
    return s;
}
'''

CHILD = r'''
import ctypes, json, sys
import opsmith
art = opsmith.build_shared_library("summer", [sys.argv[1]])
lib = ctypes.CDLL(str(art.path))
lib.opsmith_sum.restype = ctypes.c_int64
xs = (ctypes.c_int64 * 4)(1, 2, 3, 40)
print(json.dumps({"sum": lib.opsmith_sum(xs, 4), "built": art.built, "key": art.key,
                  "torch": "torch" in sys.modules,
                  "needed_torch": any(m.startswith("torch") for m in sys.modules)}))
'''


def _run(src, cache):
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", CHILD, str(src)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_plain_library_is_built_cached_and_called_without_torch(tmp_path, fresh_cache):
    src = tmp_path / "summer.cpp"
    src.write_text(LIB)
    first = _run(src, fresh_cache)
    assert first == {"sum": 46, "built": True, "key": first["key"], "torch": False, "needed_torch": False}
    second = _run(src, fresh_cache)
    assert second["sum"] == 46 and second["built"] is False and second["key"] == first["key"]
    assert second["torch"] is False


def test_the_library_links_no_torch_and_no_python(tmp_path, fresh_cache):
    import opsmith
    src = tmp_path / "summer.cpp"
    src.write_text(LIB)
    art = opsmith.build_shared_library("summer", [str(src)])
    if not have_tool("readelf"):
        pytest.skip("readelf is not installed")
    dyn = subprocess.run(["readelf", "-d", str(art.path)], capture_output=True, text=True).stdout
    needed = [line for line in dyn.splitlines() if "NEEDED" in line]
    assert needed and not any(lib in line for line in needed for lib in ("torch", "c10", "python"))


def test_profiles_key_apart(tmp_path, fresh_cache):
    """The same source as a torch-less library and as a torch library are two entries."""
    pytest.importorskip("torch")
    import opsmith
    src = tmp_path / "summer.cpp"
    src.write_text(LIB)
    plain = opsmith.build_shared_library("summer", [str(src)])
    with_torch = opsmith.build("summer", [str(src)], is_python_module=False)
    assert plain.key != with_torch.key


def test_an_unknown_profile_is_refused():
    from opsmith._build._profile import profile_for
    from opsmith._errors import SpecError

    class Spec:
        profile = "onnx-magic"
    with pytest.raises(SpecError, match="unknown build profile 'onnx-magic'"):
        profile_for(Spec())
