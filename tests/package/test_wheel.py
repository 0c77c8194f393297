"""opsmith.package._wheel: reproducible wheels, RECORD verification, pip installs them, clear errors."""
from __future__ import annotations

import stat
import subprocess
import sys
import zipfile

import pytest

from opsmith._errors import ConfigError, OpsmithError, SpecError
from opsmith._version import __version__
from opsmith.package._wheel import read_wheel, wheel_name, write_wheel

FILES = {
    "mykernels/__init__.py": b"from .ops import relu\n",
    "mykernels/ops.py": b"def relu(x):\n    return max(x, 0)\n",
    "mykernels/_lib.so": b"\x7fELF not really",
    "mykernels/kernels/relu.cu": b"__global__ void relu() {}\n",
}
EP = {"console_scripts": {"mk": "mykernels.ops:relu"}, "opsmith.ops": {"b": "mykernels:b", "a": "mykernels:a"}}


def _write(out, files=FILES, **kw):
    kw = {"name": "My.Kernels", "version": "1.2.0", "files": files, "requires": ["torch>=2.4", "numpy"],
          "entry_points": EP, "summary": "relu and friends", **kw}
    return write_wheel(out, **kw)


def _rewrite(src, dst, change):
    """Copy the zip ``src`` to ``dst``, passing each (name, data) through ``change`` (None drops it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info, data)
    return dst


def test_same_inputs_give_the_same_bytes_whatever_the_dict_order(tmp_path):
    a = _write(tmp_path / "a")
    b = _write(tmp_path / "b", files=dict(reversed(list(FILES.items()))),
               entry_points={g: dict(reversed(list(v.items()))) for g, v in reversed(list(EP.items()))})
    assert a.name == b.name == "my_kernels-1.2.0-py3-none-manylinux_2_28_x86_64.whl"
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [a.name]  # no temporary file left behind


def test_a_different_file_gives_different_bytes(tmp_path):
    a = _write(tmp_path / "a")
    b = _write(tmp_path / "b", files={**FILES, "mykernels/ops.py": b"def relu(x):\n    return x\n"})
    assert a.read_bytes() != b.read_bytes()


def test_layout_metadata_and_record(tmp_path):
    whl = _write(tmp_path, executable=["mykernels/ops.py"])
    with zipfile.ZipFile(whl) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        di = "my_kernels-1.2.0.dist-info"
        assert names == sorted(FILES) + [f"{di}/METADATA", f"{di}/WHEEL", f"{di}/entry_points.txt", f"{di}/RECORD"]
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
        modes = {i.filename: stat.S_IMODE(i.external_attr >> 16) for i in infos}
        assert modes["mykernels/_lib.so"] == modes["mykernels/ops.py"] == 0o755
        assert modes["mykernels/__init__.py"] == modes[f"{di}/RECORD"] == 0o644
        meta = zf.read(f"{di}/METADATA").decode()
        assert meta == ("Metadata-Version: 2.1\nName: My.Kernels\nVersion: 1.2.0\nSummary: relu and friends\n"
                        "Requires-Dist: torch>=2.4\nRequires-Dist: numpy\n")
        assert zf.read(f"{di}/WHEEL").decode() == (f"Wheel-Version: 1.0\nGenerator: opsmith {__version__}\n"
                                                   "Root-Is-Purelib: false\nTag: py3-none-manylinux_2_28_x86_64\n")
        assert zf.read(f"{di}/entry_points.txt").decode() == (
            "[console_scripts]\nmk = mykernels.ops:relu\n\n[opsmith.ops]\na = mykernels:a\nb = mykernels:b\n")
        record = zf.read(f"{di}/RECORD").decode().splitlines()
    assert record[-1] == f"{di}/RECORD,,"
    assert record[0].startswith("mykernels/__init__.py,sha256=") and record[0].endswith(",22")
    assert read_wheel(whl) == FILES


def test_compressed_tags_expand_and_no_entry_points_file_without_them(tmp_path):
    whl = write_wheel(tmp_path, name="k", version="1.0", files={"k.py": b""}, tag="py2.py3-none-any")
    assert whl.name == "k-1.0-py2.py3-none-any.whl"
    with zipfile.ZipFile(whl) as zf:
        assert zf.read("k-1.0.dist-info/WHEEL").decode().endswith("Tag: py2-none-any\nTag: py3-none-any\n")
        assert "k-1.0.dist-info/entry_points.txt" not in zf.namelist()


def test_source_date_epoch_is_honoured_and_clamped(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    with zipfile.ZipFile(_write(tmp_path / "a")) as zf:
        assert zf.infolist()[0].date_time == (2023, 11, 14, 22, 13, 20)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    with zipfile.ZipFile(_write(tmp_path / "b")) as zf:
        assert zf.infolist()[0].date_time == (1980, 1, 1, 0, 0, 0)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ConfigError, match="SOURCE_DATE_EPOCH='yesterday' is not an integer"):
        _write(tmp_path / "c")


def test_one_changed_byte_is_caught_by_read_wheel(tmp_path):
    whl = _write(tmp_path / "a")
    bad = _rewrite(whl, tmp_path / "bad.whl",
                   lambda n, d: d[:-1] + b"X" if n == "mykernels/ops.py" else d)
    with pytest.raises(OpsmithError, match=r"corrupt or was modified: mykernels/ops\.py does not match.*rebuild"):
        read_wheel(bad)


def test_a_flipped_byte_in_the_file_itself_is_caught(tmp_path):
    whl = _write(tmp_path / "a")
    with zipfile.ZipFile(whl) as zf:
        info = zf.getinfo("mykernels/ops.py")
    raw = bytearray(whl.read_bytes())
    raw[info.header_offset + 30 + len(info.filename) + 2] ^= 0xFF  # inside its compressed data
    whl.write_bytes(bytes(raw))
    with pytest.raises(OpsmithError, match=r"corrupt or was modified: mykernels/ops\.py cannot be read"):
        read_wheel(whl)


def test_a_missing_or_unlisted_file_is_caught(tmp_path):
    whl = _write(tmp_path / "a")
    gone = _rewrite(whl, tmp_path / "gone.whl", lambda n, d: None if n == "mykernels/ops.py" else d)
    with pytest.raises(OpsmithError, match=r"mykernels/ops\.py is listed in RECORD but missing"):
        read_wheel(gone)
    extra = _rewrite(whl, tmp_path / "extra.whl", lambda n, d: d)
    with zipfile.ZipFile(extra, "a") as zf:
        zf.writestr("mykernels/evil.py", b"import os\n")
    with pytest.raises(OpsmithError, match=r"mykernels/evil\.py is not listed in RECORD"):
        read_wheel(extra)
    (tmp_path / "junk.whl").write_bytes(b"not a zip")
    with pytest.raises(OpsmithError, match="cannot open wheel"):
        read_wheel(tmp_path / "junk.whl")


def test_pip_installs_it(tmp_path):
    whl = _write(tmp_path / "dist", tag="py3-none-any")  # a platform tag pip accepts on any machine
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                          "--disable-pip-version-check", "--target", str(site), str(whl)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for path, data in FILES.items():
        assert (site / path).read_bytes() == data
    assert (site / "mykernels/_lib.so").stat().st_mode & 0o111
    ep = (site / "my_kernels-1.2.0.dist-info/entry_points.txt").read_text()
    assert "[opsmith.ops]\na = mykernels:a\n" in ep


def test_wheel_name():
    assert wheel_name("My.Kernels", "1.0", "py3-none-any") == "my_kernels-1.0-py3-none-any.whl"
    assert wheel_name("a__b-c", "2.0rc1+cu128", "cp311-cp311-linux_x86_64") == "a_b_c-2.0rc1+cu128-cp311-cp311-linux_x86_64.whl"


@pytest.mark.parametrize("kw, message", [
    ({"name": "-bad"}, r"wheel name '-bad' is not a valid distribution name: use letters"),
    ({"name": "a b"}, r"wheel name 'a b' is not a valid distribution name"),
    ({"version": "1.0-rc1"}, r"wheel version '1.0-rc1' is not a normalised PEP 440 version: write it like"),
    ({"version": "latest"}, r"wheel version 'latest' is not a normalised PEP 440"),
    ({"tag": "py3-none"}, r"wheel tag 'py3-none' is not 'python-abi-platform': write three parts"),
    ({"tag": "py3-none-any-x"}, r"is not 'python-abi-platform'"),
    ({"files": {"/etc/passwd": b""}}, r"archive path '/etc/passwd' must be a relative posix path"),
    ({"files": {"a\\b.py": b""}}, r"must be a relative posix path"),
    ({"files": {"k/../../x.py": b""}}, r"archive path 'k/../../x.py' must name a file inside the wheel, without '..'"),
    ({"files": {"k/": b""}}, r"must name a file inside the wheel"),
    ({"files": {"k-1.0.dist-info/METADATA": b""}}, r"lies in a .dist-info folder, which the wheel writes itself"),
    ({"files": {"other-2.dist-info/RECORD": b""}}, r"lies in a .dist-info folder"),
    ({"files": {"k/a.py": b"", "./k//a.py": b""}}, r"archive paths 'k/a.py' and './k//a.py' both name 'k/a.py'"),
    ({"files": {"k/a.py": "text"}}, r"files\['k/a.py'\] is str, not bytes"),
    ({"executable": ["k/missing"]}, r"executable paths \['k/missing'\] are not in files"),
    ({"summary": "two\nlines"}, r"summary 'two\\nlines' must be a one-line string"),
    ({"requires": ["torch\nName: evil"]}, r"requirement .* must be a one-line string"),
    ({"entry_points": {"g": {"a=b": "m:f"}}}, r"entry point name 'a=b' in \[g\] must be a non-empty name"),
])
def test_validation_errors_say_what_and_how_to_fix(tmp_path, kw, message):
    kw = {"name": "k", "version": "1.0", "files": {"k/a.py": b""}, **kw}
    with pytest.raises(SpecError, match=message):
        write_wheel(tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
