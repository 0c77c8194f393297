"""End-to-end: real compilers, real ninja, real extensions loaded and called.

Every test has its own empty cache directory. Tests that include torch headers start from a
cache holding only the precompiled torch header (built once per session, then hard-linked
in), because building it takes ~25 s on a 2-core machine; the PCH tests themselves start
from an empty cache. Compiler runs are counted through a wrapper script set as OPSMITH_CXX.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import opsmith  # noqa: E402
from opsmith._cache._local import LocalStore  # noqa: E402

ADD_SRC = r'''
#include <torch/extension.h>

torch::Tensor add_tensors(torch::Tensor a, torch::Tensor b) {
    return a + b;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("add_tensors", &add_tensors, "Add two tensors");
}
'''

RELU_SRC = r'''
torch::Tensor relu(torch::Tensor x) {
  auto y = torch::empty_like(x);
  const float* xp = x.data_ptr<float>(); float* yp = y.data_ptr<float>();
  int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] > 0.f ? xp[i] : 0.f;
  return y;
}
'''

# A library with no torch headers and no Python module: compiles in a fraction of a second.
PLAIN_LIB = r'''
extern "C" int opsmith_answer() { return VALUE; }
'''


def _real_cxx() -> str:
    for c in ("clang++", "c++", "g++"):
        if shutil.which(c):
            return shutil.which(c)
    pytest.skip("no C++ compiler")


@pytest.fixture(scope="session")
def wrapper_cxx(tmp_path_factory) -> Path:
    """A compiler wrapper that logs each compile (-c) to $COUNT_LOG and can sleep first."""
    d = tmp_path_factory.mktemp("cxx")
    w = d / "cxx-wrapper"
    w.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in *" -c "*)
          [ -n "$COUNT_LOG" ] && echo "$$ $*" >> "$COUNT_LOG"
          [ -n "$COMPILE_DELAY" ] && sleep "$COMPILE_DELAY";;
        esac
        exec {_real_cxx()} "$@"
        """))
    w.chmod(0o755)
    return w


@pytest.fixture(scope="session")
def pch_cache(tmp_path_factory, wrapper_cxx) -> Path:
    """A session cache in which the torch PCH for the default flags has been built once."""
    root = tmp_path_factory.mktemp("pch-session") / "cache"
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(root), OPSMITH_CXX=str(wrapper_cxx), OPSMITH_PCH_WAIT="1")
    env.pop("COUNT_LOG", None)
    code = ("import opsmith; opsmith.load_inline('pch_seed', 'int seed_fn() { return 1; }', "
            "functions=['seed_fn'])")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return root


@pytest.fixture
def cache(fresh_cache, monkeypatch, wrapper_cxx, pch_cache, tmp_path):
    """The test's own empty cache, seeded with the session's PCH entry (hard links)."""
    monkeypatch.setenv("OPSMITH_CXX", str(wrapper_cxx))
    count = tmp_path / "compiles.log"
    monkeypatch.setenv("COUNT_LOG", str(count))
    store = LocalStore(pch_cache)
    fresh_cache.mkdir(mode=0o700, parents=True)
    for sub in ("entries", "pch-src"):
        (fresh_cache / sub).mkdir(mode=0o700)
    for info in store.list():
        if info.kind == "pch":
            shutil.copytree(info.path, fresh_cache / "entries" / info.key, copy_function=os.link)
    return fresh_cache


def compiles(tmp_path) -> int:
    log = tmp_path / "compiles.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


# -- the drop-in API -----------------------------------------------------------------------
def test_seed_add_tensors_inline_with_its_own_module_and_functions(cache, tmp_path):
    # The seed passes both its own PYBIND11_MODULE and functions=: torch fails to compile that.
    m = opsmith.load_inline(name="cpp_extension", cpp_sources=ADD_SRC, functions=["add_tensors"])
    a, b = torch.randn(5), torch.randn(5)
    assert torch.equal(m.add_tensors(a, b), a + b)
    assert m.__name__ == "cpp_extension"


def test_load_from_files_list_and_dict_functions(cache, tmp_path):
    src = tmp_path / "add.cpp"
    src.write_text(ADD_SRC)
    m = opsmith.load("add_ext", [str(src)])
    x = torch.randn(7)
    assert torch.equal(m.add_tensors(x, x), x + x)

    m2 = opsmith.load_inline("relu_list", RELU_SRC, functions=["relu"])
    m3 = opsmith.load_inline("relu_dict", RELU_SRC + "\n// dict variant\n",
                             functions={"relu": "Rectified linear unit, elementwise."})
    x = torch.randn(1000)
    assert torch.equal(m2.relu(x), torch.relu(x))
    assert torch.equal(m3.relu(x), torch.relu(x))
    assert "Rectified linear unit" in m3.relu.__doc__


def test_torch_library_op_through_torch_ops(cache, tmp_path):
    src = r'''
#include <torch/extension.h>
torch::Tensor scale2(const torch::Tensor& x) { return x * 2; }
TORCH_LIBRARY(opsmith_test, m) { m.def("scale2(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(opsmith_test, CPU, m) { m.impl("scale2", &scale2); }
'''
    path = opsmith.load_inline("scale_lib", src, is_python_module=False)
    assert isinstance(path, str) and path.endswith(".so") and os.path.isfile(path)
    x = torch.randn(4)
    assert torch.equal(torch.ops.opsmith_test.scale2(x), x * 2)


def test_standalone_executable(cache, tmp_path):
    src = tmp_path / "main.cpp"
    src.write_text('#include <torch/torch.h>\n#include <iostream>\n'
                   'int main() { auto t = torch::arange(4); std::cout << t.sum().item<long>() << "\\n"; }\n')
    exe = opsmith.load("hello_exe", [str(src)], is_python_module=False, is_standalone=True)
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "6"


def test_plain_library_without_torch_headers(cache, tmp_path):
    import ctypes
    src = tmp_path / "answer.cpp"
    src.write_text(PLAIN_LIB)
    path = opsmith.load("answer", [str(src)], extra_cflags=["-DVALUE=42"], is_python_module=False)
    assert ctypes.CDLL(path).opsmith_answer() == 42


# -- the cache key ----------------------------------------------------------------------------
def test_header_change_rebuilds_and_mtime_only_does_not(cache, tmp_path):
    import ctypes
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "value.h").write_text("#define VALUE 1\n")
    src = tmp_path / "lib.cpp"
    src.write_text('#include "value.h"\n' + PLAIN_LIB)
    build = lambda: opsmith.build("val", [str(src)], extra_include_paths=[str(inc)],  # noqa: E731
                                  is_python_module=False)
    a1 = build()
    assert a1.built and compiles(tmp_path) == 1
    assert ctypes.CDLL(str(a1.path)).opsmith_answer() == 1

    # Re-write identical bytes (a fresh checkout): new mtimes, no compiler run.
    for f in (src, inc / "value.h"):
        data = f.read_bytes()
        f.unlink()
        f.write_bytes(data)
        os.utime(f, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    a2 = build()
    assert not a2.built and a2.path == a1.path and compiles(tmp_path) == 1

    (inc / "value.h").write_text("#define VALUE 2\n")  # same size, new content
    a3 = build()
    assert a3.built and a3.key != a1.key and compiles(tmp_path) == 2
    assert ctypes.CDLL(str(a3.path)).opsmith_answer() == 2


def test_two_names_share_one_artifact(cache, tmp_path):
    m1 = opsmith.load_inline("first_name", RELU_SRC, functions=["relu"])
    m2 = opsmith.load_inline("second_name", RELU_SRC, functions=["relu"])
    assert compiles(tmp_path) == 1
    assert m1.__file__ == m2.__file__
    assert m2 is m1  # one artifact, loaded once in this process
    x = torch.randn(10)
    assert torch.equal(m2.relu(x), torch.relu(x))


def test_reload_in_same_process_returns_new_code(cache, tmp_path):
    src = "int which() { return %d; }"
    m1 = opsmith.load_inline("reloaded", src % 1, functions=["which"])
    m2 = opsmith.load_inline("reloaded", src % 2, functions=["which"])
    assert (m1.which(), m2.which()) == (1, 2)


def test_editing_one_of_two_sources_recompiles_one(cache, tmp_path):
    a = tmp_path / "a.cpp"
    b = tmp_path / "b.cpp"
    a.write_text('extern "C" int fa() { return 1; }\n')
    b.write_text('extern "C" int fb() { return 2; }\n')
    art = opsmith.build("two", [str(a), str(b)], is_python_module=False)
    assert art.compiled_units == 2
    b.write_text('extern "C" int fb() { return 3; }\n')
    art2 = opsmith.build("two", [str(a), str(b)], is_python_module=False)
    assert art2.compiled_units == 1 and compiles(tmp_path) == 3
    # Each step this call ran, timed from ninja's own log; a hit ran none.
    labels = [label for label, _ in art2.steps]
    assert labels[0].startswith("compile ") and labels[0].endswith("b.cpp") and labels[-1].startswith("link ") and len(labels) == 2
    assert all(0 <= s < 60 for _, s in art2.steps)
    assert opsmith.build("two", [str(a), str(b)], is_python_module=False).steps == ()
    import ctypes
    assert ctypes.CDLL(str(art2.path)).fb() == 3


# -- robustness ------------------------------------------------------------------------------
def test_truncated_artifact_is_rebuilt_not_loaded(cache, tmp_path):
    src = tmp_path / "t.cpp"
    src.write_text(PLAIN_LIB)
    art = opsmith.build("trunc", [str(src)], extra_cflags=["-DVALUE=7"], is_python_module=False)
    with open(art.path, "r+b") as f:
        f.truncate(100)
    art2 = opsmith.build("trunc", [str(src)], extra_cflags=["-DVALUE=7"], is_python_module=False)
    assert art2.built  # the link was redone (the object came from the cache)
    import ctypes
    assert ctypes.CDLL(str(art2.path)).opsmith_answer() == 7


def test_foreign_owned_entry_is_refused(cache, tmp_path):
    if os.getuid() != 0:
        pytest.skip("changing an entry's owner needs root")
    src = tmp_path / "f.cpp"
    src.write_text(PLAIN_LIB)
    art = opsmith.build("foreign", [str(src)], extra_cflags=["-DVALUE=1"], is_python_module=False)
    os.chown(art.path.parent / "manifest.json", 4321, 4321)
    with pytest.raises(opsmith.CacheError, match="belongs to uid 4321.*another user's code"):
        opsmith.build("foreign", [str(src)], extra_cflags=["-DVALUE=1"], is_python_module=False)


def _loader_script(name: str, src: str) -> str:
    return textwrap.dedent(f"""
        import ctypes, json, opsmith
        p = opsmith.load({name!r}, [{src!r}], extra_cflags=["-DVALUE=5"], is_python_module=False)
        print(json.dumps({{"answer": ctypes.CDLL(p).opsmith_answer(), "path": p}}))
    """)


def test_eight_concurrent_processes_one_compile(cache, tmp_path):
    src = tmp_path / "c.cpp"
    src.write_text(PLAIN_LIB)
    env = dict(os.environ, COMPILE_DELAY="1")
    procs = [subprocess.Popen([sys.executable, "-c", _loader_script("conc", str(src))], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert {r["answer"] for r in results} == {5}
    assert len({r["path"] for r in results}) == 1
    assert compiles(tmp_path) == 1


def test_kill_during_build_leaves_nothing_that_blocks(cache, tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text(PLAIN_LIB)
    env = dict(os.environ, COMPILE_DELAY="60")
    p = subprocess.Popen([sys.executable, "-c", _loader_script("killed", str(src))], env=env,
                         start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while compiles(tmp_path) == 0:
        assert time.time() < deadline and p.poll() is None, "the build never started"
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)  # the loader, ninja and the compiler, mid-build
    p.wait()
    t0 = time.time()
    path = opsmith.load("killed", [str(src)], extra_cflags=["-DVALUE=5"], is_python_module=False)
    assert time.time() - t0 < 30
    import ctypes
    assert ctypes.CDLL(path).opsmith_answer() == 5
    assert compiles(tmp_path) == 2


# -- errors ---------------------------------------------------------------------------------
def test_compile_error_points_at_the_users_inline_line(cache, tmp_path):
    src = "int ok() { return 1; }\n\nint bad() { return undefined_name; }\n"
    with pytest.raises(opsmith.CompileError) as info:
        opsmith.load_inline("broken", src, functions=["ok"])
    msg = str(info.value)
    first = msg.splitlines()[0]
    assert first.startswith("cpp_sources[0]:3:"), msg
    assert "undefined_name" in first
    assert "> 3 | int bad() { return undefined_name; }" in msg
    log_path = msg.split("full log: ")[1].splitlines()[0]
    assert os.path.isfile(log_path) and "undefined_name" in Path(log_path).read_text()
    assert info.value.command and info.value.line == 3
    # nothing half-built was published
    assert all(i.kind in ("pch", "object", "link-stubs") for i in LocalStore(cache).list())


def test_compile_error_in_a_file_and_bad_flag(cache, tmp_path):
    src = tmp_path / "bad.cpp"
    src.write_text("int f() {\n  return 1\n}\n")
    with pytest.raises(opsmith.CompileError) as info:
        opsmith.load("badfile", [str(src)], is_python_module=False)
    assert str(info.value).startswith(f"{src}:2:")
    good = tmp_path / "good.cpp"
    good.write_text(PLAIN_LIB.replace("VALUE", "1"))
    with pytest.raises(opsmith.CompileError, match="-fno-such-flag"):
        opsmith.load("badflag", [str(good)], extra_cflags=["-fno-such-flag"], is_python_module=False)


def test_link_error_names_the_symbol(cache, tmp_path):
    src = tmp_path / "l.cpp"
    src.write_text('int missing_fn(int);\nint main() { return missing_fn(1); }\n')
    with pytest.raises(opsmith.LinkError, match="undefined symbol `missing_fn"):
        opsmith.load("linkerr", [str(src)], is_standalone=True, is_python_module=False)


def test_missing_compiler_is_a_toolchain_error(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("OPSMITH_CXX", "no-such-compiler-xyz")
    src = tmp_path / "a.cpp"
    src.write_text(PLAIN_LIB)
    with pytest.raises(opsmith.ToolchainError, match="no-such-compiler-xyz.*not found"):
        opsmith.load("nocc", [str(src)], is_python_module=False)


def test_module_without_init_is_a_clear_error(cache, tmp_path):
    src = tmp_path / "nomod.cpp"
    src.write_text(PLAIN_LIB.replace("VALUE", "3"))
    with pytest.raises(opsmith.SpecError, match="not a Python extension module.*is_python_module=False"):
        opsmith.load("nomod", [str(src)])


def test_torch_extensions_dir_is_honoured(cache, tmp_path, monkeypatch):
    monkeypatch.delenv("OPSMITH_CACHE_DIR")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "tx"))
    src = tmp_path / "a.cpp"
    src.write_text(PLAIN_LIB)
    from opsmith._cache._open import reset
    reset()
    p = opsmith.load("txdir", [str(src)], extra_cflags=["-DVALUE=1"], is_python_module=False)
    assert p.startswith(str(tmp_path / "tx"))


def test_gcc_builds_a_torch_module_without_pch(fresh_cache, monkeypatch, tmp_path):
    if not shutil.which("g++"):
        pytest.skip("g++ is not installed")
    monkeypatch.setenv("OPSMITH_CXX", "g++")
    monkeypatch.setenv("OPSMITH_PCH", "0")
    m = opsmith.load_inline("gcc_relu", RELU_SRC, functions=["relu"])
    x = torch.randn(100)
    assert torch.equal(m.relu(x), torch.relu(x))


def test_pch_rejected_by_the_compiler_falls_back_and_is_removed(cache, tmp_path, pch_cache):
    """clang refuses a PCH whose header changed since it was built: opsmith builds without it."""
    from opsmith._toolchain._cxx import find_cxx
    if find_cxx().family != "clang":
        pytest.skip("only clang validates the PCH's input files by mtime")
    header = pch_cache / "pch-src" / "torch_extension_pch.h"
    st = header.stat()
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    try:
        m = opsmith.load_inline("pch_fallback", RELU_SRC + "// fallback\n", functions=["relu"])
    finally:
        os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    x = torch.randn(50)
    assert torch.equal(m.relu(x), torch.relu(x))
    assert not [i for i in LocalStore(cache).list() if i.kind == "pch"]  # the rejected PCH is gone


def test_log_level_variable_prints_commands_and_step_times(cache, tmp_path):
    """OPSMITH_LOG_LEVEL=INFO: the build's commands and its per-step times on stderr."""
    src = tmp_path / "lv.cpp"
    src.write_text('extern "C" int lv() { return 7; }\n')
    code = f"import opsmith; opsmith.build('lv', [{str(src)!r}], is_python_module=False)"
    env = dict(os.environ, OPSMITH_LOG_LEVEL="info", PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"opsmith: compile {src}: " in p.stderr
    assert "opsmith: built lv in " in p.stderr and "link lv.so " in p.stderr
