"""Link stubs: torch's libraries stood in for by their names at link time."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest

from opsmith._build import _linkstubs
from opsmith._config import settings


def _cc() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@pytest.mark.skipif(_cc() is None, reason="no C compiler")
def test_elf_soname_reads_what_the_linker_wrote(tmp_path):
    out = tmp_path / "libx.so"
    subprocess.run([_cc(), "-shared", "-nostdlib", "-Wl,-soname,libx.so.3", "-x", "c", os.devnull,
                    "-o", str(out)], check=True)
    assert _linkstubs.elf_soname(out) == "libx.so.3"
    plain = tmp_path / "libnone.so"
    subprocess.run([_cc(), "-shared", "-nostdlib", "-x", "c", os.devnull, "-o", str(plain)], check=True)
    assert _linkstubs.elf_soname(plain) is None


@pytest.mark.parametrize("data", [b"", b"not an elf file at all" * 10, b"\x7fELF\x02\x01" + b"\0" * 20,
                                  b"\x7fELF\x01\x01" + b"\0" * 80])
def test_elf_soname_of_garbage_is_none(tmp_path, data):
    p = tmp_path / "g.so"
    p.write_bytes(data)
    assert _linkstubs.elf_soname(p) is None


def test_truncated_elf_is_none_not_a_crash(tmp_path):
    torch = pytest.importorskip("torch")
    real = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    data = open(real, "rb").read(4096)
    p = tmp_path / "t.so"
    p.write_bytes(data)
    assert _linkstubs.elf_soname(p) in (None, "libc10.so")
    assert _linkstubs.elf_soname(real) == "libc10.so"


def test_stubs_only_where_undefined_symbols_are_allowed(monkeypatch):
    assert _linkstubs.wanted("module", ["-shared", "-lc10"])
    assert not _linkstubs.wanted("executable", ["-lc10"])
    assert not _linkstubs.wanted("module", ["-shared", "-Wl,-z,defs"])
    assert not _linkstubs.wanted("library", ["-Wl,--no-undefined"])
    monkeypatch.setenv("OPSMITH_LINK_STUBS", "0")
    assert not _linkstubs.wanted("module", ["-shared"])


def _link_command(caplog) -> str:
    return next(r.getMessage() for r in caplog.records if r.getMessage().startswith("link "))


@pytest.mark.parametrize("stubs", [True, False])
def test_module_links_against_stubs_and_imports(tmp_path, caplog, stubs):
    torch = pytest.importorskip("torch")
    import opsmith
    src = tmp_path / "st.cpp"
    src.write_text("#include <torch/extension.h>\n"
                   "torch::Tensor thrice(torch::Tensor x) { return x * 3; }\n"
                   "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"thrice\", &thrice); }\n")
    caplog.set_level(logging.INFO, logger="opsmith")
    with settings.override(link_stubs=stubs, pch=False):
        m = opsmith.load(f"stubbed_{int(stubs)}", [str(src)])
    assert torch.equal(m.thrice(torch.ones(3)), torch.full((3,), 3.0))
    cmd = _link_command(caplog)
    assert ("--no-as-needed" in cmd and "libtorch_cpu.so" in cmd) == stubs
    assert (" -ltorch_cpu" in cmd) == (not stubs)


def test_a_linker_that_refuses_the_stubs_falls_back_to_the_real_libraries(tmp_path, caplog, monkeypatch):
    pytest.importorskip("torch")
    import opsmith
    from opsmith._toolchain._cxx import find_cxx
    from opsmith._cache._open import open_cache
    real = find_cxx(open_cache().state).path
    wrapper = tmp_path / "old-ld-cxx"
    wrapper.write_text("#!/bin/sh\ncase \"$*\" in *--push-state*) "
                       "echo \"ld: unrecognized option '--push-state'\" >&2; exit 1;; esac\n"
                       f"exec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("OPSMITH_CXX", str(wrapper))
    src = tmp_path / "plain.cpp"
    src.write_text('extern "C" int plain_fn() { return 41; }\n')
    caplog.set_level(logging.INFO, logger="opsmith")
    art = opsmith.build("plain_stubs", [str(src)], is_python_module=False)
    import ctypes
    assert ctypes.CDLL(str(art.path)).plain_fn() == 41
    # Only the link step ran again: the source was compiled once.
    assert [label.split()[0] for label, _ in art.steps] == ["compile", "link"]
    assert any("link stubs failed" in r.getMessage() for r in caplog.records)
    links = [r.getMessage() for r in caplog.records if r.getMessage().startswith("link ")]
    assert "--push-state" in links[0] and " -ltorch_cpu" in links[-1]
