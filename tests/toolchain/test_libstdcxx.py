"""One C++ runtime per process: a compiler that would link libstdc++.a into a shared object (its
libstdc++.so missing, as on a GPU machine whose g++ wrapper finds only the archive) links the
process's libstdc++.so.6 instead. Without that the module's iostreams print nothing here and
segfault there (every TORCH_CHECK message with a number in it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from opsmith._errors import ToolchainError
from opsmith._toolchain import _libstdcxx
from opsmith._toolchain._cxx import probe_compiler

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"),
                                reason="needs g++ on Linux")

FMT = r"""
#include <sstream>
#include <string>
#include <cstring>
extern "C" int fmt(char *out, int len) {
    std::ostringstream ss;
    ss << "n=" << 5 << " x=" << 2.5;
    std::string s = ss.str();
    std::strncpy(out, s.c_str(), len - 1);
    out[len - 1] = 0;
    return (int)s.size();
}
"""


def _static_gxx(tmp_path, shared6: bool = True) -> str:
    """A g++ that finds libstdc++.a but no libstdc++.so (and, with not shared6, no .so.6 either)."""
    path = tmp_path / "static-g++"
    hide = "-print-file-name=libstdc++.so|-print-file-name=libstdc++.so.6" if not shared6 \
        else "-print-file-name=libstdc++.so"
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in {hide}) echo "${{1#-print-file-name=}}"; exit 0;; esac
        exec g++ -static-libstdc++ "$@"
    """))
    path.chmod(0o755)
    return str(path)


def _needed(so: str) -> list[str]:
    out = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def test_a_normal_gxx_links_the_shared_runtime():
    comp = probe_compiler(shutil.which("g++"))
    assert not _libstdcxx.links_static_runtime(comp)
    assert _libstdcxx.shared_runtime(comp) is None


def test_a_static_gxx_is_detected_and_given_the_process_runtime(tmp_path):
    comp = probe_compiler(_static_gxx(tmp_path))
    assert _libstdcxx.links_static_runtime(comp)
    runtime = _libstdcxx.shared_runtime(comp)
    assert runtime and os.path.basename(runtime).startswith("libstdc++.so") and os.path.exists(runtime)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
def test_a_shared_library_built_by_a_static_gxx_has_one_runtime(tmp_path, monkeypatch):
    """The real build: the library needs libstdc++.so.6 and its iostreams work in this process
    (a second, static runtime prints an empty string here)."""
    import ctypes

    import opsmith
    monkeypatch.setenv("CXX", _static_gxx(tmp_path))
    from opsmith._config import reset
    reset()
    src = tmp_path / "fmt.cpp"
    src.write_text(FMT)
    art = opsmith.build_shared_library("fmt_static_gxx", [str(src)])
    assert "libstdc++.so.6" in _needed(str(art.path))
    buf = ctypes.create_string_buffer(64)
    ctypes.CDLL(str(art.path)).fmt(buf, 64)
    assert buf.value == b"n=5 x=2.5"


def test_no_shared_runtime_anywhere_is_a_clear_error(tmp_path, monkeypatch):
    comp = probe_compiler(_static_gxx(tmp_path, shared6=False))
    monkeypatch.setattr(_libstdcxx, "_loaded_runtime", lambda: None)
    with pytest.raises(ToolchainError, match=r"links libstdc\+\+ statically into shared objects.*Point CXX at"):
        _libstdcxx.shared_runtime(comp)


def test_doctor_says_which_runtime_modules_link(tmp_path):
    from opsmith.cli._doctor import _cxx_runtime
    normal = _cxx_runtime(probe_compiler(shutil.which("g++")))
    assert normal.status == "ok" and "shared libstdc++" in normal.found
    static = _cxx_runtime(probe_compiler(_static_gxx(tmp_path)))
    assert static.status == "warning" and "only libstdc++.a; opsmith links" in static.found
