"""Fast unit tests of the engine's logic: keys, settings, store, depfiles, specs, diagnostics."""
from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest

import opsmith
from opsmith._cache import _deps
from opsmith._build import _diagnostics
from opsmith._config import settings
from opsmith._cache._keys import KeyBuilder
from opsmith._spec import ExtensionSpec
from opsmith._cache._local import LocalStore
from opsmith._cache._locks import Locks
from opsmith._cache._state import State


# -- keys -------------------------------------------------------------------------------
def test_key_fields_are_typed_and_length_prefixed():
    a = KeyBuilder("d").str("x", "ab").str("x", "c").hexdigest()
    b = KeyBuilder("d").str("x", "a").str("x", "bc").hexdigest()
    assert a != b
    assert KeyBuilder("d").str("x", "ab").hexdigest() != KeyBuilder("d").bytes("x", b"ab").hexdigest()
    assert KeyBuilder("d").str("x", None).hexdigest() != KeyBuilder("d").str("x", "").hexdigest()
    assert KeyBuilder("d").strs("f", ["-O2"]).hexdigest() == KeyBuilder("d").strs("f", ["-O2"]).hexdigest()
    assert KeyBuilder("d").strs("f", ["-O2", "-g"]).hexdigest() != KeyBuilder("d").strs("f", ["-O2-g"]).hexdigest()
    assert len(a) == 32


# -- settings ---------------------------------------------------------------------------
def test_settings_precedence_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("OPSMITH_CACHE_DIR")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_ext"))
    assert settings.cache_dir == str(tmp_path / "torch_ext")
    monkeypatch.setenv("OPSMITH_CACHE_DIR", str(tmp_path / "mine"))
    assert settings.cache_dir == str(tmp_path / "mine")
    with settings.override(cache_dir="/elsewhere", opt_level="-O3"):
        assert settings.cache_dir == "/elsewhere"
        assert settings.opt_level == "-O3"
    assert settings.opt_level == ""  # torch's default: no -O flag


def test_settings_bad_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "zero")
    with pytest.raises(opsmith.ConfigError, match="MAX_JOBS='zero'"):
        settings.max_jobs
    monkeypatch.setenv("MAX_JOBS", "3")
    assert settings.max_jobs == 3
    monkeypatch.setenv("OPSMITH_PCH", "maybe")
    with pytest.raises(opsmith.ConfigError, match="OPSMITH_PCH"):
        settings.pch
    with pytest.raises(opsmith.ConfigError, match="unknown setting"):
        with settings.override(nope=1):
            pass
    monkeypatch.setenv("OPSMITH_LOG_LEVEL", "loud")
    with pytest.raises(opsmith.ConfigError, match="OPSMITH_LOG_LEVEL='loud'.*DEBUG, INFO"):
        settings.log_level
    monkeypatch.setenv("OPSMITH_LOG_LEVEL", "info")
    assert settings.log_level == "INFO"


def test_max_jobs_is_capped_by_memory(monkeypatch):
    from opsmith._toolchain import _cxx as _toolchain
    monkeypatch.setattr(_toolchain, "_available_memory_bytes", lambda: 3 << 30)  # 3 GiB
    assert _toolchain.max_jobs(per_job_bytes=3 << 29) == min(2, os.cpu_count() or 1)
    monkeypatch.setattr(_toolchain, "_available_memory_bytes", lambda: 1 << 20)
    assert _toolchain.max_jobs() == 1


# -- import is cheap ----------------------------------------------------------------------
def test_import_touches_nothing(tmp_path):
    code = ("import sys, opsmith, os; "
            "print(json.dumps({'torch': 'torch' in sys.modules, 'cuda': any(m.startswith('cuda') for m in sys.modules), "
            "'filelock': 'filelock' in sys.modules, 'cache': os.path.exists(os.environ['OPSMITH_CACHE_DIR'])}))")
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(tmp_path / "never"))
    out = subprocess.run([sys.executable, "-c", "import json; " + code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == {"torch": False, "cuda": False, "filelock": False, "cache": False}


# -- store ------------------------------------------------------------------------------
def _put(store, key, tmp_path, data=b"payload"):
    f = tmp_path / f"src-{key}"
    f.write_bytes(data)
    return store.put(key, {"lib.so": f}, kind="module", name="x", meta={"file": "lib.so"})


def test_store_put_get_and_private_mode(tmp_path):
    store = LocalStore(tmp_path / "c")
    e = _put(store, "k1", tmp_path)
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o700
    got = store.get("k1")
    assert got is not None and got.file("lib.so").read_bytes() == b"payload"
    assert store.get("nope") is None
    infos = {i.key: i for i in store.list()}
    assert infos["k1"].hits == 1 and infos["k1"].size == len(b"payload")
    assert e.meta["file"] == "lib.so"


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_store_detects_corruption_and_removes_entry(tmp_path, damage):
    store = LocalStore(tmp_path / "c")
    e = _put(store, "k1", tmp_path, b"x" * 1000)
    f = e.file("lib.so")
    if damage == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(10)
    elif damage == "flip":
        f.write_bytes(b"y" * 1000)
    elif damage == "delete":
        f.unlink()
    else:
        (e.path / "manifest.json").write_text("{not json")
    assert store.get("k1") is None
    assert not e.path.exists()


def test_store_second_put_of_same_key_keeps_the_first(tmp_path):
    store = LocalStore(tmp_path / "c")
    _put(store, "k1", tmp_path, b"first")
    e = _put(store, "k1", tmp_path, b"second")
    assert e.file("lib.so").read_bytes() == b"first"
    assert not list((tmp_path / "c" / "tmp").iterdir())


def test_store_refuses_foreign_entry(tmp_path):
    store = LocalStore(tmp_path / "c")
    e = _put(store, "k1", tmp_path)
    if os.getuid() != 0:
        pytest.skip("changing an entry's owner needs root")
    os.chown(e.path / "manifest.json", 4242, 4242)
    with pytest.raises(opsmith.CacheError, match="belongs to uid 4242"):
        store.get("k1")


def test_store_refuses_dir_writable_by_others(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(opsmith.CacheError, match="chmod 700"):
        LocalStore(root).ensure()


def test_store_refuses_dir_of_another_user(tmp_path):
    if os.getuid() != 0:
        pytest.skip("creating a directory owned by another user needs root")
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 4242, 4242)
    with pytest.raises(opsmith.CacheError, match="belongs to uid 4242"):
        LocalStore(root).ensure()


def test_store_disk_full_is_a_clear_error(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "c")
    store.ensure()
    import shutil as _sh

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(_sh, "copyfile", full)
    with pytest.raises(opsmith.CacheError, match="no space left.*prune"):
        _put(store, "k1", tmp_path)
    assert store.get("k1") is None
    assert not list((tmp_path / "c" / "tmp").iterdir())  # nothing half-written left behind


def test_state_roundtrip_and_corrupt_document_is_none(tmp_path):
    state = State(tmp_path / "c")
    assert state.put("ns", "a", {"v": [1, 2]})
    assert state.get("ns", "a") == {"v": [1, 2]}
    (tmp_path / "c" / "records" / "ns" / "a.json").write_text("{trunc")
    assert state.get("ns", "a") is None
    calls = []
    assert state.memo("ns", "b", lambda: calls.append(1) or {"x": 1}) == {"x": 1}
    assert state.memo("ns", "b", lambda: calls.append(1) or {"x": 2}) == {"x": 1}
    assert state.memo("ns", "b", lambda: calls.append(1) or {"x": 3}, valid=lambda d: d["x"] == 3) == {"x": 3}
    assert len(calls) == 2


def test_lock_excludes_other_processes(tmp_path):
    locks = Locks(tmp_path / "c")
    script = textwrap.dedent(f"""
        from opsmith._cache._locks import Locks
        with Locks({str(tmp_path / 'c')!r}).hold("k"):
            print("got", flush=True)
    """)
    with locks.hold("k"):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=1.5)
    assert p.communicate(timeout=20)[0].strip() == "got"


def test_lock_of_killed_holder_is_released(tmp_path):
    locks = Locks(tmp_path / "c")
    script = (f"from opsmith._cache._locks import Locks\nimport time\n"
              f"s = Locks({str(tmp_path / 'c')!r})\n"
              f"with s.hold('k'):\n    print('held', flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    p.kill()
    p.wait()
    with locks.hold("k"):  # would hang forever with a polled lock file left behind
        pass


# -- depfiles and the dependency index --------------------------------------------------
def test_parse_depfile_handles_continuations_and_escapes():
    text = "obj.o: /src/a.cpp /inc/b.h \\\n  /inc/with\\ space.h /inc/c$$.h\n/inc/b.h:\n"
    assert _deps.parse_depfile(text) == ["/src/a.cpp", "/inc/b.h", "/inc/with space.h", "/inc/c$.h"]


def test_dep_index_content_not_mtime(tmp_path):
    h = tmp_path / "h.h"
    h.write_text("#define X 1\n")
    idx = _deps.DepIndex(State(tmp_path / "c"))
    key = idx.record("pre", _deps.snapshot([str(h)], []))
    assert idx.resolve("pre") == key
    os.utime(h, ns=(1, 1))  # new mtime, same bytes: still a hit
    assert idx.resolve("pre") == key
    h.write_text("#define X 2\n")  # same size, new bytes: a miss
    assert idx.resolve("pre") is None
    key2 = idx.record("pre", _deps.snapshot([str(h)], []))
    assert key2 != key and idx.resolve("pre") == key2
    h.write_text("#define X 1\n")  # back to the first content: the first key again
    assert idx.resolve("pre") == key


def test_snapshot_skips_toolchain_headers(tmp_path):
    sysdir = tmp_path / "sys"
    sysdir.mkdir()
    (sysdir / "s.h").write_text("x")
    (tmp_path / "u.h").write_text("y")
    snap = _deps.snapshot([str(sysdir / "s.h"), "u.h"], [str(sysdir)], base=str(tmp_path))
    assert [os.path.basename(s[0]) for s in snap] == ["u.h"]


# -- specs: bad input fails before anything runs ----------------------------------------
def test_spec_errors(tmp_path):
    with pytest.raises(opsmith.SpecError, match="sources is empty"):
        opsmith.load("x", [])
    with pytest.raises(opsmith.SpecError, match="does not exist"):
        opsmith.load("x", [str(tmp_path / "missing.cpp")])
    src = tmp_path / "a.cpp"
    src.write_text("int f() { return 1; }\n")
    with pytest.raises(opsmith.SpecError, match="not a valid Python module name.*'my_ext'"):
        opsmith.load("my-ext", [str(src)])
    with pytest.raises(opsmith.SpecError, match=r"list of strings, e.g. \['-O3'\]"):
        opsmith.load("x", [str(src)], extra_cflags="-O3")
    with pytest.raises(opsmith.SpecError, match="mutually exclusive"):
        opsmith.load("x", [str(src)], is_standalone=True)
    with pytest.raises(opsmith.SpecError, match="both empty"):
        opsmith.load_inline("x", "", cuda_sources=None)
    with pytest.raises(opsmith.SpecError, match="functions must be"):
        opsmith.load_inline("x", "int f();", functions=3)
    with pytest.raises(opsmith.SpecError, match="with_cuda=False"):
        (tmp_path / "k.cu").write_text("")
        opsmith.load("x", [str(tmp_path / "k.cu")], with_cuda=False)
    assert not os.path.exists(os.environ["OPSMITH_CACHE_DIR"])  # nothing ran, nothing was created


def test_inline_spec_marks_user_lines():
    spec = ExtensionSpec.from_inline("m", ["int a;", "int f(int);"], functions={"f": 'say "hi"'}, kind="module")
    text = spec.sources[0].text.decode()
    assert text.splitlines()[0] == "#include <torch/extension.h>"
    assert '#line 1 "cpp_sources[1]"' in text
    assert 'm.def("f", torch::wrap_pybind_function(f), "say \\"hi\\"");' in text


# -- diagnostics ------------------------------------------------------------------------
GCC_OUT = """\
In file included from /x/main.cpp:2:
cpp_sources[0]: In function 'at::Tensor f(at::Tensor)':
cpp_sources[0]:3:12: error: 'undefined_thing' was not declared in this scope
    3 |     return undefined_thing(x);
"""
NVCC_OUT = "/home/u/relu_kernel.cu(7): error: identifier \"blockIdxx\" is undefined\n"


def test_first_error_prefers_user_file_and_shows_excerpt():
    err = _diagnostics.compile_error(GCC_OUT, command=["c++", "-c", "main.cpp"],
                                     sources={"cpp_sources[0]": "a\nb\n  return undefined_thing(x);\nd\n"},
                                     log_path="/tmp/log")
    msg = str(err)
    assert msg.startswith("cpp_sources[0]:3:12: error: 'undefined_thing' was not declared")
    assert "> 3 |   return undefined_thing(x);" in msg
    assert "\n             ^" in msg or "^" in msg.split("> 3 |")[1].splitlines()[1]
    assert "full log: /tmp/log" in msg and "command: c++ -c main.cpp" in msg
    assert err.line == 3 and err.source == "cpp_sources[0]"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is opsmith.CompileError and again.line == 3 and str(again) == msg


def test_nvcc_error_format_and_link_error():
    d = _diagnostics.first_error(NVCC_OUT, ["/home/u/relu_kernel.cu"])
    assert (d.file, d.line) == ("/home/u/relu_kernel.cu", 7)
    err = _diagnostics.link_error("main.o: undefined reference to `relu_cuda_launcher(float const*, float*, int)'\n",
                                  command=["c++"], log_path=None, with_cuda=True)
    assert isinstance(err, opsmith.LinkError)
    assert "undefined symbol `relu_cuda_launcher(float const*, float*, int)`" in str(err)
    assert "CUDA source" in str(err)


def test_torch_std_comes_from_the_ninja_flags_not_docstrings():
    from opsmith._toolchain._cxx import torch_std_from_source
    torch_211_like = ("    minimum required compiler flags (e.g. ``-std=c++20``)\n"
                      "        cflags = common_cflags + ['-fPIC', '-std=c++17'] + extra_cflags\n"
                      "                cuda_flags.append('-std=c++17')\n")
    assert torch_std_from_source(torch_211_like) == "c++17"
    assert torch_std_from_source("cflags = common_cflags + ['-fPIC', '-std=c++20'] + extra") == "c++20"
    assert torch_std_from_source("nothing here") == "c++17"


def test_store_rewrite_with_restored_mtime_is_still_caught(tmp_path):
    store = LocalStore(tmp_path / "c")
    e = _put(store, "k1", tmp_path, b"a" * 4096)
    assert store.get("k1") is not None  # stamped: no re-hash needed
    f = e.file("lib.so")
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(100)
        fh.write(b"b")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime; ctime moved
    assert store.get("k1") is None


def test_store_reads_without_stamps_rehash_and_restamp(tmp_path):
    store = LocalStore(tmp_path / "c")
    e = _put(store, "k1", tmp_path)
    (e.path / "verified").unlink()
    assert store.get("k1") is not None
    assert (e.path / "verified").exists()


def test_an_edit_that_keeps_the_size_and_restores_the_mtime_is_seen(tmp_path):
    """The one stamp policy (size, mtime, ctime, inode): ctime moves on any write."""
    from opsmith._cache._stamps import stamp, unchanged
    h = tmp_path / "h.h"
    h.write_text("#define X 1\n")
    before = os.stat(h)
    idx = _deps.DepIndex(State(tmp_path / "c"))
    key = idx.record("pre", _deps.snapshot([str(h)], []))
    recorded = stamp(h)
    time.sleep(0.01)
    h.write_text("#define X 2\n")
    os.utime(h, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as before
    assert os.stat(h).st_size == before.st_size and os.stat(h).st_mtime_ns == before.st_mtime_ns
    assert not unchanged(h, recorded)
    assert idx.resolve("pre") is None  # the bytes differ: the old key must not come back
    assert idx.resolve("pre") != key


def test_must_hit_miss_answers_without_taking_the_build_lock(tmp_path, monkeypatch):
    """A must-hit lookup (an installed opsmith package's import) that misses raises at once: no
    build lock, so no wait on another process's build and no filelock import on that path."""
    from opsmith._cache import _locks
    from opsmith._errors import CacheError
    src = tmp_path / "m.cpp"
    src.write_text("int f() { return 1; }\n")
    taken = []
    real = _locks.Locks.hold

    def hold(self, key, *a, **k):
        taken.append(key)
        return real(self, key, *a, **k)
    monkeypatch.setattr(_locks.Locks, "hold", hold)
    with settings.override(must_hit=True), pytest.raises(CacheError, match="must-hit mode"):
        opsmith.load("musthit_lib", [str(src)], is_python_module=False, build_directory=str(tmp_path / "b"))
    assert taken == []
