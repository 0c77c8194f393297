"""Keys that travel: the same sources checked out at two paths share one cache entry.

The compilers map the sources' root to /opsmith/src (-ffile-prefix-map), so the output names
no checkout; the keys name the source, the include paths and the headers under the root
relative to it, and headers elsewhere by absolute path + sha256.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time

import pytest

import opsmith
from opsmith._build import _prefix
from opsmith._cache import _deps
from opsmith._errors import CompileError
from opsmith._record import Record

LIB = ('#include "lib.h"\n#include "vendor.h"\n'
       'extern "C" const char* where() { return __FILE__; }\n'
       'extern "C" const char* header_where() { return header_file(); }\n'
       'extern "C" int answer() { return ANSWER + VENDOR; }\n')
HEADER = '#define ANSWER 40\nstatic inline const char* header_file() { return __FILE__; }\n'


@pytest.fixture
def checkouts(tmp_path):
    """Two git checkouts of one project (csrc/ + include/) and a vendor header outside both."""
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "vendor.h").write_text("#define VENDOR 2\n")
    roots = []
    for name in ("alice/work/proj", "bob/scratch/node7/proj-copy"):
        root = tmp_path / name
        (root / "csrc").mkdir(parents=True)
        (root / "include").mkdir()
        (root / "csrc" / "lib.cpp").write_text(LIB)
        (root / "include" / "lib.h").write_text(HEADER)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        roots.append(root)
    return roots[0], roots[1], vendor


def _build(root, vendor, **kw):
    t0 = time.perf_counter()
    art = opsmith.build("travel", [str(root / "csrc" / "lib.cpp")], is_python_module=False,
                        extra_include_paths=[str(root / "include"), str(vendor)],
                        extra_cflags=["-g"], **kw)
    return art, time.perf_counter() - t0


def _lib(art):
    lib = ctypes.CDLL(str(art.path))
    lib.where.restype = lib.header_where.restype = ctypes.c_char_p
    return lib


def test_two_checkouts_share_one_entry(checkouts):
    a, b, vendor = checkouts
    first, t_first = _build(a, vendor)
    second, t_second = _build(b, vendor)
    assert first.built and first.compiled_units == 1
    assert not second.built and second.compiled_units == 0
    assert second.key == first.key and second.path == first.path
    assert t_second < t_first
    lib = _lib(second)
    assert lib.answer() == 42
    assert lib.where() == b"/opsmith/src/csrc/lib.cpp"
    assert lib.header_where() == b"/opsmith/src/include/lib.h"
    # The warm index re-checks the second checkout's own files, not the first's.
    assert str(b / "csrc" / "lib.cpp") in second.inputs
    assert os.path.realpath(b / "include" / "lib.h") in second.inputs


def test_debug_info_names_the_canonical_path(checkouts, tmp_path):
    a, b, vendor = checkouts
    art, _ = _build(a, vendor)
    data = art.path.read_bytes()
    assert b"/opsmith/src/csrc/lib.cpp" in data
    assert os.fsencode(tmp_path) not in data  # no checkout, no temporary build directory
    readelf = shutil.which("readelf")
    if readelf:  # binutils: read the DWARF itself, not just the bytes
        info = subprocess.run([readelf, "--debug-dump=info", str(art.path)], capture_output=True,
                              text=True, check=True).stdout
        assert "/opsmith/src" in info and "/opsmith/build" in info  # DW_AT_name, DW_AT_comp_dir
        assert str(tmp_path) not in info


def test_an_edit_in_one_checkout_rebuilds_only_there(checkouts):
    a, b, vendor = checkouts
    first, _ = _build(a, vendor)
    (b / "include" / "lib.h").write_text(HEADER.replace("40", "50"))
    edited, _ = _build(b, vendor)
    assert edited.built and edited.compiled_units == 1 and edited.key != first.key
    assert _lib(edited).answer() == 52
    again, _ = _build(a, vendor)  # the untouched checkout still has its entry
    assert not again.built and again.key == first.key


def test_a_header_outside_the_checkout_keys_by_absolute_path_and_content(checkouts, tmp_path):
    a, b, vendor = checkouts
    first, _ = _build(a, vendor)
    assert os.path.realpath(vendor / "vendor.h") in first.inputs
    (vendor / "vendor.h").write_text("#define VENDOR 3\n")
    edited, _ = _build(b, vendor)
    assert edited.built and edited.key != first.key and _lib(edited).answer() == 43
    # The same bytes at another absolute path are another key (its path is not mapped).
    other = tmp_path / "vendor2"
    shutil.copytree(vendor, other)
    moved, _ = _build(b, other)
    assert moved.built and moved.key != edited.key


def test_errors_name_the_real_file(checkouts):
    a, b, vendor = checkouts
    _build(a, vendor)
    bad = b / "csrc" / "lib.cpp"
    bad.write_text(LIB + "int broken() { return undeclared_name; }\n")
    with pytest.raises(CompileError) as exc:
        _build(b, vendor)
    message = str(exc.value)
    assert str(bad) in message and "undeclared_name" in message
    # The diagnostics name the real file (compilers do not map their messages); the prefix
    # maps appear only in the command quoted for a re-run.
    lines = [ln for ln in message.splitlines() if "-ffile-prefix-map" not in ln]
    assert lines[0].startswith(str(bad)) or str(bad) in lines[0], lines[0]
    assert not any("/opsmith/src" in ln for ln in lines), message


def test_without_a_checkout_the_sources_directory_is_the_root(tmp_path):
    arts = []
    for name in ("one", "two"):
        d = tmp_path / name / "src"
        (d / "inc").mkdir(parents=True)
        (d / "inc" / "v.h").write_text("#define V 7\n")
        (d / "plain.cpp").write_text('#include "v.h"\nextern "C" int v() { return V; }\n')
        arts.append(opsmith.build("plain_travel", [str(d / "plain.cpp")], is_python_module=False,
                                  extra_include_paths=[str(d / "inc")]))
    assert arts[0].built and not arts[1].built and arts[0].key == arts[1].key
    assert ctypes.CDLL(str(arts[1].path)).v() == 7


# -- units: the pieces, without a compiler ---------------------------------------------------

class _Spec(Record):
    __slots__ = ("sources", "extra_include_paths")


class _Src(Record):
    __slots__ = ("path",)


def test_source_roots_find_the_checkout_or_the_common_directory(tmp_path):
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "b").mkdir(parents=True)
    spec = _Spec(sources=(_Src(path=str(tmp_path / "repo" / "a" / "b" / "x.cpp")),), extra_include_paths=())
    assert _prefix.source_roots(spec).given == str(tmp_path / "repo")
    bare = _Spec(sources=(_Src(path=str(tmp_path / "p" / "q" / "x.cpp")), _Src(path=str(tmp_path / "p" / "y.cpp"))),
                 extra_include_paths=())
    assert _prefix.source_roots(bare).given == str(tmp_path / "p")
    beside = _Spec(sources=(_Src(path=str(tmp_path / "p" / "csrc" / "x.cpp")),),
                   extra_include_paths=(str(tmp_path / "p" / "include"),))
    assert _prefix.source_roots(beside).given == str(tmp_path / "p")  # an unpacked sdist
    system = _Spec(sources=(_Src(path=str(tmp_path / "p" / "csrc" / "x.cpp")),), extra_include_paths=("/usr/include/eigen3",))
    assert _prefix.source_roots(system).given == str(tmp_path / "p" / "csrc")
    assert _prefix.source_roots(_Spec(sources=(_Src(path=None),), extra_include_paths=())) is None
    odd = _Spec(sources=(_Src(path=str(tmp_path / "a,b" / "x.cpp")),), extra_include_paths=())
    assert _prefix.source_roots(odd) is None  # nvcc's -Xcompiler splits at commas


def test_key_flags_name_include_paths_under_the_root_canonically():
    roots = _prefix.Roots(given="/home/u/proj", real="/mnt/disk/u/proj")
    flags = ["-I/home/u/proj/include", "-I", "/mnt/disk/u/proj/third", "-isystem", "/usr/include/x",
             "-include", "/home/u/proj/pre.h", "-DPATH=/home/u/proj", "-I/home/u/projector"]
    assert _prefix.map_flags(flags, roots) == [
        "-I/opsmith/src/include", "-I", "/opsmith/src/third", "-isystem", "/usr/include/x",
        "-include", "/opsmith/src/pre.h", "-DPATH=/home/u/proj", "-I/home/u/projector"]


def test_snapshot_and_resolve_map_headers_under_the_root(tmp_path):
    root = tmp_path / "proj"
    (root / "include").mkdir(parents=True)
    inside, outside = root / "include" / "a.h", tmp_path / "b.h"
    inside.write_text("a")
    outside.write_text("b")
    rel = (str(root), _prefix.CANONICAL_SRC)
    snap = _deps.snapshot([str(inside), str(outside)], [], root=rel)
    assert [s[0] for s in snap] == ["/opsmith/src/include/a.h", str(outside)]
    assert _deps.real_path(snap[0][0], rel) == str(inside)
    # The key covers the canonical name and the bytes: a copy elsewhere keys alike.
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    snap2 = _deps.snapshot([str(copy / "include" / "a.h"), str(outside)], [], root=(str(copy), _prefix.CANONICAL_SRC))
    assert _deps.key_for("p", snap) == _deps.key_for("p", snap2)
    (copy / "include" / "a.h").write_text("c")
    snap3 = _deps.snapshot([str(copy / "include" / "a.h"), str(outside)], [], root=(str(copy), _prefix.CANONICAL_SRC))
    assert _deps.key_for("p", snap3) != _deps.key_for("p", snap)


class _Tool(Record):
    __slots__ = ("family", "version", "host_family", "host_version")
    _defaults = {"family": None, "version": None, "host_family": None, "host_version": None}


def test_which_compilers_map_paths():
    assert _prefix.cxx_maps_paths(_Tool(family="gcc", version="12.2.0"))
    assert _prefix.cxx_maps_paths(_Tool(family="clang", version="10.0.0"))
    assert not _prefix.cxx_maps_paths(_Tool(family="gcc", version="7.5.0"))
    assert not _prefix.cxx_maps_paths(_Tool(family="clang", version="9.0.1"))
    assert not _prefix.cxx_maps_paths(_Tool(family="msvc", version="19.3"))
    nv = _Tool(host_family="gcc", host_version="12.2.0")
    assert _prefix.nvcc_maps_paths(nv, ["-ccbin", "/usr/bin/g++", "-O3"])
    assert not _prefix.nvcc_maps_paths(nv, ["-ccbin", "/usr/bin/g++", "-lineinfo"])  # device lines
    assert not _prefix.nvcc_maps_paths(nv, ["-G", "-ccbin", "/usr/bin/g++"])
    assert not _prefix.nvcc_maps_paths(nv, ["-DX", "-ccbin", "/opt/gcc7/g++"])  # the user's host compiler
    roots = _prefix.Roots(given="/a/proj", real="/b/proj")
    assert _prefix.command_flags("nvcc", roots, "/tmp/build-x") == [
        "-Xcompiler", "-ffile-prefix-map=/a/proj=/opsmith/src",
        "-Xcompiler", "-ffile-prefix-map=/b/proj=/opsmith/src",
        "-Xcompiler", "-ffile-prefix-map=/tmp/build-x=/opsmith/build"]


CU = ('#include "k.cuh"\n__global__ void k(int* p) { *p = K; }\n'
      'extern "C" const char* where() { return __FILE__; }\n'
      'extern "C" int k_value() { return K; }\n')


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_sources_travel_too(tmp_path, monkeypatch):
    """nvcc gives the maps to its host compiler (-Xcompiler); compiling needs no GPU."""
    monkeypatch.setenv("OPSMITH_CUDA_WITH_CPU_TORCH", "1")
    arts = []
    for name in ("one", "two"):
        root = tmp_path / name
        (root / "include").mkdir(parents=True)
        (root / "include" / "k.cuh").write_text("#define K 5\n")
        (root / "kern.cu").write_text(CU)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        arts.append(opsmith.build("cu_travel", [str(root / "kern.cu")], is_python_module=False,
                                  extra_include_paths=[str(root / "include")]))
    assert arts[0].built and arts[0].compiled_units == 1
    assert not arts[1].built and arts[1].key == arts[0].key
    data = arts[1].path.read_bytes()
    assert b"/opsmith/src/kern.cu" in data and os.fsencode(tmp_path) not in data
