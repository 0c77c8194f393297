"""``opsmith doctor``: every check, each condition created for real where this machine allows it.

Conditions that need root (a noexec, read-only or full filesystem) use a small tmpfs mount
and are skipped, with the reason, where mounting is not allowed; the full-disk case then
falls back to an injected ``OSError(ENOSPC)``.
"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsmith.cli import _doctor, _doctor_cuda

OPSMITH = shutil.which("opsmith")


def _doctor_json(env_changes: dict[str, str | None] | None = None, *, python_prelude: str = "",
                 timeout: float = 120) -> tuple[int, dict]:
    """Run the installed `opsmith doctor --json` (or, with a prelude, the same main in python)."""
    env = dict(os.environ)
    for k, v in (env_changes or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    if python_prelude:
        cmd = [sys.executable, "-c", f"{python_prelude}\nimport sys\nfrom opsmith.cli import main\n"
               f"sys.exit(main(['doctor', '--json']))"]
    else:
        assert OPSMITH, "the opsmith entry point is not installed (pip install -e .)"
        cmd = [OPSMITH, "doctor", "--json"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _rows(doc: dict, name: str) -> list[dict]:
    return [c for c in doc["checks"] if c["name"] == name]


def _row(doc: dict, name: str) -> dict:
    rows = _rows(doc, name)
    assert rows, f"no {name!r} row in {[c['name'] for c in doc['checks']]}"
    return rows[0]


def _rows_of(rows, name):
    return [r for r in rows if r.name == name]


# -- the whole table ---------------------------------------------------------------------------
def test_doctor_json_has_every_check_and_exit_status_zero_when_nothing_blocks():
    rc, doc = _doctor_json()
    names = {c["name"] for c in doc["checks"]}
    for expected in ("settings", "python", "torch", "C++ compiler", "ninja", "CUDA_HOME", "nvcc",
                     "NVRTC", "CUDA driver", "TORCH_CUDA_ARCH_LIST", "cache directory", "cache free space"):
        assert expected in names
    assert any(n == "GPUs" or n.startswith("GPU ") for n in names)
    for c in doc["checks"]:
        assert c["status"] in ("ok", "warning", "problem")
        if c["status"] != "ok":
            assert c["fix"], c
    assert doc["problems"] == 0, [c for c in doc["checks"] if c["status"] == "problem"]
    assert rc == 0 and doc["ok"] is True
    torch_row = _row(doc, "torch")["found"]
    assert "_GLIBCXX_USE_CXX11_ABI=" in torch_row and ("CUDA" in torch_row or "CPU" in torch_row)


def test_doctor_table_is_plain_text_when_not_a_terminal():
    proc = subprocess.run([OPSMITH, "doctor"], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("opsmith ") and lines[0].endswith(" doctor")
    assert any(ln.split()[:2] == ["ok", "python"] for ln in lines)
    assert "\x1b[" not in proc.stdout  # no colour codes in a pipe
    assert lines[-1].startswith(("no problems", "everything"))


# -- CUDA_HOME / nvcc --------------------------------------------------------------------------
def _path_without(tool: str) -> str:
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.access(os.path.join(d, tool), os.X_OK)]
    return os.pathsep.join(keep)


def test_cuda_home_pointing_at_no_toolkit_and_no_nvcc_on_path(tmp_path):
    """The tutorial's `CUDA_HOME environment variable is not set` / nvcc missing, made for real."""
    empty = tmp_path / "no-cuda"
    empty.mkdir()
    rc, doc = _doctor_json({"PATH": _path_without("nvcc"), "CUDA_HOME": str(empty), "CUDA_PATH": None})
    home = _row(doc, "CUDA_HOME")
    assert home["status"] == "problem" and "has no bin/nvcc" in home["found"]
    assert "CUDA_HOME" in home["fix"]
    nvcc = _row(doc, "nvcc")
    assert nvcc["status"] != "ok" and nvcc["fix"]
    assert rc == 1 and doc["ok"] is False


def test_cuda_home_set_to_a_missing_directory(tmp_path):
    rc, doc = _doctor_json({"CUDA_HOME": str(tmp_path / "nowhere")})
    row = _row(doc, "CUDA_HOME")
    assert row["status"] == "problem" and "does not exist" in row["found"]
    assert "export CUDA_HOME=" in row["fix"]
    assert rc == 1


@pytest.mark.skipif(importlib.util.find_spec("opsmith._toolchain._nvcc") is None,
                    reason="opsmith._toolchain._nvcc (nvcc support) is not in this tree yet")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_nvcc_found_with_its_version():
    ctx = _doctor._Context()
    _doctor.check_torch(ctx)
    _doctor.check_compilers(ctx)
    rows = _doctor.check_nvcc(ctx)
    assert rows[0].status == "ok" and rows[0].name == "nvcc"
    assert any(ch.isdigit() for ch in rows[0].found)


def test_cuda_version_rule_major_blocks_minor_does_not():
    """The tutorial's `12.0 vs 12.8 minor version mismatch` (needs a CUDA torch to create for real)."""
    class Nvcc:
        path = "/usr/local/cuda/bin/nvcc"

        def __init__(self, v):
            self.version = v

    ctx = _doctor._Context()
    ctx.torch_cuda = "12.8"
    minor = _doctor_cuda._cuda_versions(ctx, Nvcc("12.0"))[0]
    assert minor.status == "ok" and "minor" in minor.found
    major = _doctor_cuda._cuda_versions(ctx, Nvcc("13.0"))[0]
    assert major.status == "problem" and "12.x" in major.fix
    ctx.torch_cuda = None
    cpu = _doctor_cuda._cuda_versions(ctx, Nvcc("13.0"))[0]
    assert cpu.status == "warning" and "download.pytorch.org" in cpu.fix


# -- TORCH_CUDA_ARCH_LIST ----------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("opsmith._toolchain._archs") is None,
                    reason="opsmith._toolchain._archs (the arch-list parser) is not in this tree yet")
def test_arch_list_of_a_cuda_version_is_a_problem_with_the_fix(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "12.8")  # torch's CUDA version in the tutorial
    rc, doc = _doctor_json()
    row = _row(doc, "TORCH_CUDA_ARCH_LIST")
    assert row["status"] == "problem" and "12.8" in row["found"] and "CUDA version" in row["fix"]
    assert rc == 1
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    (ok,) = _doctor.check_arch_list(_doctor._Context())
    assert ok.status == "ok" and "8.0;9.0+PTX" in ok.found


def test_arch_list_unset_is_ok(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    (row,) = _doctor.check_arch_list(_doctor._Context())
    assert row.status == "ok" and "unset" in row.found


# -- ninja, compilers, settings, NVRTC ---------------------------------------------------------
def _bin_without_ninja(tmp_path: Path) -> str:
    """A PATH holding the compilers and nothing else (in particular no ninja)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("clang++", "g++", "c++", "clang", "gcc", "cc", "ld", "as"):
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    return str(bindir)


def test_ninja_missing_is_a_problem_with_the_install_command(tmp_path):
    # No ninja on PATH, and the `ninja` Python package made unimportable in that process.
    rc, doc = _doctor_json({"PATH": _bin_without_ninja(tmp_path)},
                           python_prelude="import sys; sys.modules['ninja'] = None")
    row = _row(doc, "ninja")
    assert row["status"] == "problem" and "pip install ninja" in row["fix"]
    assert rc == 1


def test_no_cxx_compiler_is_a_problem(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    rc, doc = _doctor_json({"PATH": str(empty), "CXX": None, "OPSMITH_CXX": None},
                           python_prelude="pass")  # run by absolute python: PATH has nothing
    row = _row(doc, "C++ compiler")
    assert row["status"] == "problem" and "apt-get install" in row["fix"]
    assert rc == 1


def test_cxx_naming_a_missing_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler++")
    rows = _doctor.check_compilers(_doctor._Context())
    assert rows[0].status == "problem" and "no-such-compiler++" in rows[0].fix


def test_invalid_optimisation_flag_is_rejected_by_the_real_compiler(monkeypatch):
    """§8 'invalid compiler flags': the flag every build gets, tried on the real compiler."""
    monkeypatch.setenv("OPSMITH_OPT_LEVEL", "-Obogus")
    rows = _doctor.check_compilers(_doctor._Context())
    (row,) = _rows_of(rows, "OPSMITH_OPT_LEVEL")
    assert row.status == "problem" and "-Obogus" in row.found and "-O2" in row.fix


def test_invalid_setting_is_a_problem(monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "lots")
    (row,) = _doctor.check_settings(_doctor._Context())
    assert row.status == "problem" and "MAX_JOBS" in row.fix and "max_jobs" in row.found


def test_cuda_bindings_missing_says_how_to_install():
    rc, doc = _doctor_json(python_prelude="import sys; sys.modules['cuda.bindings'] = None")
    row = _row(doc, "NVRTC")
    assert row["status"] == "warning" and "opsmith[cuda]" in row["fix"]


def test_driver_and_gpus_rows():
    rows = _doctor.check_driver_and_gpus(_doctor._Context())
    driver = _rows_of(rows, "CUDA driver")[0]
    gpus = [r for r in rows if r.name == "GPUs" or r.name.startswith("GPU ")]
    assert gpus
    if driver.status == "ok":
        assert "supports CUDA" in driver.found
        assert all("compute capability" in r.found for r in gpus if r.name.startswith("GPU "))
    else:
        assert driver.status == "warning" and "libcuda" in driver.fix


@pytest.mark.gpu
def test_gpus_listed_with_compute_capability():
    rc, doc = _doctor_json()
    gpus = [c for c in doc["checks"] if c["name"].startswith("GPU ")]
    assert gpus and all("compute capability" in g["found"] and "sm_" in g["found"] for g in gpus)
    assert _row(doc, "CUDA driver")["status"] == "ok"


# -- the cache directory -----------------------------------------------------------------------
@contextlib.contextmanager
def _tmpfs(path: Path, options: str):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=False,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(proc.stderr or proc.stdout).strip() or 'not root'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def test_cache_dir_ok_and_not_created_by_doctor(fresh_cache):
    rows = _doctor.check_cache(_doctor._Context())
    assert [r.status for r in rows] == ["ok", "ok"]
    assert "not created yet" in rows[0].found
    assert not fresh_cache.exists()


def test_cache_dir_writable_by_others_is_a_problem(fresh_cache):
    fresh_cache.mkdir()
    os.chmod(fresh_cache, 0o777)
    (row, *_) = _doctor.check_cache(_doctor._Context())
    assert row.status == "problem" and f"chmod 700 {fresh_cache}" in row.fix


def test_cache_dir_read_only(fresh_cache, tmp_path, monkeypatch):
    if os.geteuid() != 0:
        fresh_cache.mkdir(mode=0o700)
        os.chmod(fresh_cache, 0o500)
        (row, *_) = _doctor.check_cache(_doctor._Context())
        assert row.status == "problem" and "not writable" in row.found and "chmod u+rwx" in row.fix
        return
    # root writes through permission bits: make the filesystem itself read-only.
    with _tmpfs(tmp_path / "ro", "size=4m,mode=700") as mnt:
        cache = mnt / "cache"
        cache.mkdir(mode=0o700)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        monkeypatch.setenv("OPSMITH_CACHE_DIR", str(cache))
        (row, *_) = _doctor.check_cache(_doctor._Context())
        assert row.status == "problem" and "read-only" in row.found and "OPSMITH_CACHE_DIR" in row.fix
        rc, doc = _doctor_json()
        assert rc == 1 and _row(doc, "cache directory")["status"] == "problem"


def test_cache_dir_on_a_noexec_mount(tmp_path, monkeypatch):
    with _tmpfs(tmp_path / "noexec", "size=64m,noexec,mode=700") as mnt:
        monkeypatch.setenv("OPSMITH_CACHE_DIR", str(mnt / "cache"))
        rc, doc = _doctor_json()
        row = _row(doc, "cache directory")
        assert row["status"] == "problem" and "noexec" in row["found"] and "OPSMITH_CACHE_DIR" in row["fix"]
        assert rc == 1


def test_cache_dir_on_a_full_filesystem(tmp_path, monkeypatch):
    with _tmpfs(tmp_path / "full", "size=1m,mode=700") as mnt:
        cache = mnt / "cache"
        cache.mkdir(mode=0o700)
        with open(mnt / "filler", "wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        monkeypatch.setenv("OPSMITH_CACHE_DIR", str(cache))
        rows = _doctor.check_cache(_doctor._Context())
        (space,) = _rows_of(rows, "cache free space")
        assert space.status == "problem" and "full" in space.found and "prune" in space.fix


def test_cache_write_failing_with_enospc_is_reported_as_full(fresh_cache, monkeypatch):
    """The injected fallback for machines where no small filesystem can be mounted."""
    monkeypatch.setattr(_doctor, "_write_probe", lambda d: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    rows = _doctor.check_cache(_doctor._Context())
    (space,) = _rows_of(rows, "cache free space")
    assert space.status == "problem" and "full" in space.found


def test_cache_contents_are_counted(fresh_cache, tmp_path):
    from opsmith._cache._open import open_store
    store = open_store()
    (tmp_path / "f").write_bytes(b"abc")
    store.put("k1", {"f": tmp_path / "f"}, kind="module", name="m")
    rows = _doctor.check_cache(_doctor._Context())
    (contents,) = _rows_of(rows, "cache contents")
    assert contents.status == "ok" and contents.found.startswith("1 entry, ")


def test_mount_of_finds_the_longest_mount_point():
    point, fstype, _ = _doctor._mount_of("/proc/self")
    assert point == "/proc" and fstype == "proc"


@pytest.mark.skipif(importlib.util.find_spec("opsmith._toolchain._archs") is None,
                    reason="opsmith._toolchain._archs (the arch-list parser) is not in this tree yet")
def test_arch_list_12_0_with_a_cuda_12_0_nvcc_is_the_tutorials_compute_120_failure(monkeypatch):
    """The tutorial: TORCH_CUDA_ARCH_LIST=12.0 with nvcc 12.0 -> `Unsupported gpu architecture
    'compute_120'`. The nvcc here is described (its version and archs), not installed."""
    class Nvcc12:
        version = "12.0"
        archs = ("5.0", "5.2", "6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0")

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "12.0")
    ctx = _doctor._Context()
    ctx.nvcc, ctx.torch_cuda = Nvcc12(), "12.8"
    (row,) = _doctor.check_arch_list(ctx)
    assert row.status == "problem" and "compute_120" in row.fix and "CUDA version" in row.fix


@pytest.mark.skipif(importlib.util.find_spec("opsmith._toolchain._archs") is None,
                    reason="opsmith._toolchain._archs (the arch-list parser) is not in this tree yet")
def test_arch_list_that_no_gpu_here_can_run_is_a_warning(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    ctx = _doctor._Context()
    ctx.gpu_archs = ["sm_90"]  # as check_driver_and_gpus records an H100
    (row,) = _doctor.check_arch_list(ctx)
    assert row.status == "warning" and "TORCH_CUDA_ARCH_LIST=9.0" in row.fix


def test_rich_table_keeps_brackets_in_text():
    import io
    rows = [_doctor.Check("cache free space", "problem", "cannot write: [Errno 28] No space left",
                          "Free space [now]: opsmith cache prune --max-size 2G")]
    out = io.StringIO()
    from opsmith.cli._doctor_report import render
    render(rows, out, rich=True)
    assert "[Errno 28]" in out.getvalue() and "[now]" in out.getvalue()
