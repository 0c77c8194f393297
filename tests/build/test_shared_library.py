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


# -- C sources: compiled as C by the C compiler (issue 24, item 2) ---------------------------------------------
ANSWER_C = "int answer(void) { return 42; }\n"
# C that is not C++: `new` is a name, and void* converts to int* without a cast.
C_ONLY = r'''
#include <stdlib.h>
int twice(int);
int answer_twice(void) {
    int *new = malloc(sizeof *new);
    *new = twice(21);
    int value = *new;
    free(new);
    return value;
}
int half(int x) { return x / 2; }
'''
CXX_PART = r'''
#include <vector>
extern "C" int half(int);
extern "C" int twice(int x) { std::vector<int> v{x, x}; return v[0] + v[1]; }
extern "C" int quarter(int x) { return half(half(x)); }
'''


def _needed(path) -> list[str]:
    if not have_tool("readelf"):
        pytest.skip("readelf is not installed")
    dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    return [line for line in dyn.splitlines() if "NEEDED" in line]


def test_a_c_library_exports_its_c_names(tmp_path, fresh_cache):
    """The docstring's own example: answer.c called through ctypes by its C name."""
    import ctypes

    import opsmith
    src = tmp_path / "answer.c"
    src.write_text(ANSWER_C)
    art = opsmith.build_shared_library("answer", [str(src)])
    assert ctypes.CDLL(str(art.path)).answer() == 42
    # linked by the C driver: a C library does not depend on the C++ runtime
    assert not any("libstdc++" in line for line in _needed(art.path))


def test_c_and_cpp_sources_link_into_one_library(tmp_path, fresh_cache):
    import ctypes

    import opsmith
    (tmp_path / "c_part.c").write_text(C_ONLY)
    (tmp_path / "cxx_part.cpp").write_text(CXX_PART)
    art = opsmith.build_shared_library("mixed", [str(tmp_path / "c_part.c"), str(tmp_path / "cxx_part.cpp")])
    lib = ctypes.CDLL(str(art.path))
    assert lib.answer_twice() == 42 and lib.quarter(40) == 10
    assert any("libstdc++" in line for line in _needed(art.path))  # linked by the C++ driver


def _plan_of(spec):
    from opsmith._build._plan import Toolchain, plan
    from opsmith._cache._open import open_cache
    return plan(spec, Toolchain(open_cache(), spec))


def test_c_units_get_c_flags_and_cpp_units_cpp_flags(tmp_path):
    from opsmith._build._profile_shared import C_STD
    from opsmith._spec import ExtensionSpec
    (tmp_path / "a.c").write_text(ANSWER_C)
    (tmp_path / "b.cpp").write_text(CXX_PART)
    srcs = [str(tmp_path / "a.c"), str(tmp_path / "b.cpp")]

    def units(flags):
        spec = ExtensionSpec.from_files("lib", srcs, kind="library", profile="shared-library",
                                        extra_cflags=flags)
        return {u.source.lang: u for u in _plan_of(spec)}

    plain = units(["-DX=1"])
    assert plain["c"].rule == "cc" and plain["c++"].rule == "cxx"
    assert plain["c"].compiler != plain["c++"].compiler
    assert C_STD in plain["c"].flags and "-DX=1" in plain["c"].flags
    assert not any(f.startswith("-std=") for f in plain["c++"].flags)
    # a -std= in extra_cflags goes to the language it names; a C one replaces the default
    both = units(["-std=c11", "-std=c++17"])
    assert [f for f in both["c"].flags if f.startswith("-std=")] == ["-std=c11"]
    assert [f for f in both["c++"].flags if f.startswith("-std=")] == ["-std=c++17"]


@pytest.mark.skipif(not (have_tool("gcc") and have_tool("clang")), reason="needs both gcc and clang")
def test_the_c_compiler_is_in_the_key(tmp_path, monkeypatch):
    """CC names the C compiler; changing it changes the key of C units, not of C++ ones."""
    from opsmith._config import reset
    from opsmith._spec import ExtensionSpec
    (tmp_path / "a.c").write_text(ANSWER_C)
    (tmp_path / "b.cpp").write_text(CXX_PART)
    prekeys = {}
    for cc in ("gcc", "clang"):
        monkeypatch.setenv("CC", cc)
        reset()
        spec = ExtensionSpec.from_files("lib", [str(tmp_path / "a.c"), str(tmp_path / "b.cpp")],
                                        kind="library", profile="shared-library")
        units = {u.source.lang: u for u in _plan_of(spec)}
        assert os.path.basename(units["c"].compiler) == cc
        prekeys[cc] = (units["c"].prekey, units["c++"].prekey)
    assert prekeys["gcc"][0] != prekeys["clang"][0]
    assert prekeys["gcc"][1] == prekeys["clang"][1]


def test_the_c_compiler_is_of_the_cpp_compilers_family(monkeypatch):
    from opsmith._cache._open import open_cache
    from opsmith._config import reset
    from opsmith._toolchain._cc import find_cc
    from opsmith._toolchain._cxx import find_cxx
    monkeypatch.delenv("CC", raising=False)
    for cxx in ("g++", "clang++"):
        if not have_tool(cxx):
            continue
        monkeypatch.setenv("CXX", cxx)
        reset()
        state = open_cache().state
        assert find_cc(find_cxx(state), state).family == find_cxx(state).family
    monkeypatch.setenv("CC", "no-such-cc-anywhere")
    reset()
    from opsmith._errors import ToolchainError
    with pytest.raises(ToolchainError, match="'no-such-cc-anywhere' named by CC was not found"):
        find_cc(find_cxx(open_cache().state), open_cache().state)


def test_a_c_syntax_error_leads_with_its_file_and_line(tmp_path, fresh_cache):
    import opsmith
    src = tmp_path / "broken.c"
    src.write_text("int answer(void) {\n  return 42\n}\n")
    with pytest.raises(opsmith.CompileError) as info:
        opsmith.build_shared_library("broken", [str(src)])
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"{src}:2:") and "error" in first


def test_a_torch_extension_compiles_c_as_cpp_as_torch_does(tmp_path, fresh_cache):
    """torch's builder gives a .c to its C++ compiler (g++ compiles it as C++): so does the drop-in."""
    pytest.importorskip("torch")
    import ctypes

    import opsmith
    src = tmp_path / "answer.c"
    src.write_text("template <int N> int constant() { return N; }\nint answer(void) { return constant<42>(); }\n")
    art = opsmith.build("answer_ext", [str(src)], is_python_module=False)
    lib = ctypes.CDLL(str(art.path))
    assert lib._Z6answerv() == 42
    assert not hasattr(lib, "answer")


def test_a_static_library_is_an_archive_of_the_shared_librarys_objects(tmp_path, fresh_cache):
    """kind="archive": the units compiled as for the shared library (the same keys: compiled once)
    and put together by ar, each member under its own name; a program links the archive."""
    from opsmith._build._profile_shared import build_shared_library, build_static_library
    (tmp_path / "answer.c").write_text(ANSWER_C)
    (tmp_path / "twice.c").write_text("int twice(int x) { return 2 * x; }\n")
    srcs = [str(tmp_path / "answer.c"), str(tmp_path / "twice.c")]
    shared = build_shared_library("answer", srcs)
    static = build_static_library("answer", srcs)
    assert static.kind == "archive" and static.path.name == "answer.a" and static.key != shared.key
    assert static.built and static.compiled_units == 0  # both objects came from the shared build
    assert build_static_library("answer", srcs).built is False  # cached
    if not have_tool("ar"):
        pytest.skip("ar is not installed")
    members = subprocess.run(["ar", "t", str(static.path)], capture_output=True, text=True).stdout.split()
    assert members == ["answer.o", "twice.o"]
    main = tmp_path / "main.c"
    main.write_text("int answer(void);\nint twice(int);\nint main(void) { return twice(answer()) == 84 ? 0 : 1; }\n")
    exe = tmp_path / "main"
    cc = "gcc" if have_tool("gcc") else "cc"
    subprocess.run([cc, str(main), str(static.path), "-o", str(exe)], check=True, timeout=300)
    assert subprocess.run([str(exe)], timeout=60).returncode == 0
