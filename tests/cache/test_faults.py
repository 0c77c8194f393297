"""The artifact store's fault suite (issue 10): many processes, kill -9, a full disk, a
read-only cache, flipped bits, foreign and world-writable directories.

Builds are a tiny C++ library (``extern "C"``, no torch header) through ``build_inline`` /
``load_inline(is_python_module=False)``; the 32-process case uses NVRTC (no GPU needed), since
32 processes importing torch take over a minute on 2 cores. Killed builds run in a child
forked from this process (torch already imported) and pause at a named point of
:mod:`opsmith._cache._faults` (``OPSMITH_TEST_FAULT``); "during the compile" is caught by
watching ``/proc`` for the compiler. After every fault the next load must succeed and every
entry in ``store.list()`` must pass ``store.verify``.

Full disk: when the test can mount a small tmpfs (root with CAP_SYS_ADMIN, as on our CI and
dev machines) the cache lives on one and is really filled; otherwise ENOSPC is injected at
the write boundary (``Path.write_text`` in the store, a compiler wrapper that fails with
"No space left on device"). Read-only: a read-only bind mount when root (``os.access``
ignores mode bits for root), ``chmod 0500`` when not root.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import opsmith
from opsmith._errors import CacheError

SRC = 'extern "C" int fx_answer(void) { return 42; }'
# Slow enough (about a second) that a kill lands while the compiler runs.
SLOW_SRC = ('#include <regex>\n#include <string>\n'
            'extern "C" int fx_answer(void) { std::regex r("(a|b)*c+[0-9]{2,5}");'
            ' return std::regex_match(std::string("abac12"), r) ? 42 : 0; }')
IS_ROOT = os.geteuid() == 0


def _build(src=SRC, name="fx", **kw):
    return opsmith.build_inline(name, src, is_python_module=False, no_implicit_headers=True, **kw)


def _load(src=SRC, name="fx", **kw):
    opsmith.load_inline(name, src, is_python_module=False, no_implicit_headers=True, **kw)
    art = _build(src, name, **kw)
    assert ctypes.CDLL(os.fspath(art.path)).fx_answer() == 42
    return art


def _store():
    from opsmith._cache._open import open_store
    return open_store()


def _assert_sound() -> list:
    """Every entry is whole: its manifest parses and every file matches its sha256."""
    store = _store()
    infos = list(store.list())
    for info in infos:
        assert info.kind != "corrupt", f"half-written entry {info.path}"
        assert store.verify(info.key) is None, (info.path, store.verify(info.key))
    return infos


def _reset():
    from opsmith._cache._open import reset
    reset()


# -- forked workers ----------------------------------------------------------------------------------
def _fork(fn, result: pathlib.Path) -> int:
    pid = os.fork()
    if pid == 0:  # the child: run, write what happened, never return into pytest
        code = 1
        try:
            fn()
            result.write_text(json.dumps({"ok": True}))
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            try:
                result.write_text(json.dumps({"ok": False, "type": type(exc).__name__, "msg": str(exc)}))
            except BaseException:  # noqa: BLE001
                pass
        finally:
            os._exit(code)
    return pid


def _wait_for(pred, pid: int, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            pytest.fail(f"the worker exited ({status}) before {what}")
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def _pause_at(point: str, fn, tmp_path, monkeypatch) -> tuple[int, pathlib.Path, pathlib.Path]:
    """Fork ``fn`` with the hook armed at ``point``; return once the child sits there."""
    marker = tmp_path / f"paused-{point.replace(':', '-')}"
    result = tmp_path / f"result-{point.replace(':', '-')}.json"
    monkeypatch.setenv("OPSMITH_TEST_FAULT", f"{point}@{marker}")
    try:
        pid = _fork(fn, result)
    finally:
        monkeypatch.delenv("OPSMITH_TEST_FAULT")
    _wait_for(marker.exists, pid, f"the point {point}")
    return pid, marker, result


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _compiler_running(root: pathlib.Path) -> bool:
    """A compiler process whose command line names a file under ``root`` (this test's cache)."""
    needle = os.fspath(root).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if needle in cmd and b"\0-c\0" in cmd and b"ninja" not in cmd.split(b"\0")[0]:
            return True
    return False


# -- 32 processes ----------------------------------------------------------------------------------
_NVRTC_WORKER = r"""
import json, os, sys, time
go = sys.argv[1]
from opsmith._build._nvrtc import compile_cuda
while not os.path.exists(go):
    time.sleep(0.005)
b = compile_cuda('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }', arch="sm_90")
print(json.dumps({"from_cache": b.from_cache, "size": len(b.code)}))
"""


def _nvrtc_or_skip():
    try:
        from opsmith._build._nvrtc import nvrtc_version
        nvrtc_version()
    except ImportError as exc:
        pytest.skip(f"NVRTC is not available: {exc}")


def test_32_processes_compile_once_and_all_succeed(tmp_path, fresh_cache):
    _nvrtc_or_skip()
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _NVRTC_WORKER, os.fspath(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(32)]
    time.sleep(1.0)
    go.write_text("")  # all at once
    answers = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err
            answers.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(answers) == 32
    assert sum(not a["from_cache"] for a in answers) == 1  # exactly one compiled
    assert len({a["size"] for a in answers}) == 1
    infos = _assert_sound()
    assert [i.kind for i in infos] == ["cubin"]


# -- kill -9 at points of a build and a publish ------------------------------------------------------
# (point, keep_intermediates): with intermediates the first put is the object entry's; without,
# the put points land in the link entry's publish.
KILL_POINTS = [
    ("build:locked", True),             # lock held, before looking again
    ("build:before-compile", True),     # build dir and sources written, ninja not started
    ("compile", True),                  # while the compiler runs (seen in /proc)
    ("state:deps2", True),              # the dependency index written, before its os.replace
    ("put:staged", True),               # object entry: staging dir made
    ("put:copied", True),               # object entry: files in staging, no manifest
    ("put:manifest", True),             # object entry: manifest written, before os.replace
    ("put:replaced", True),             # object entry: published, before its stamps
    ("build:objects-published", True),  # objects published, link entry not
    ("put:manifest", False),            # link entry: manifest written, before os.replace
    ("put:replaced", False),            # link entry: published, before its stamps
    ("build:published", True),          # artifact published, warm index not written
    ("state:warm", True),               # during the warm index write
]


@pytest.mark.parametrize("point,keep", KILL_POINTS, ids=[f"{p}-{'obj' if k else 'link'}" for p, k in KILL_POINTS])
def test_kill_9_then_the_next_load_succeeds_and_no_entry_is_half_written(point, keep, tmp_path, fresh_cache,
                                                                         monkeypatch):
    src = SLOW_SRC if point == "compile" else SRC
    if point == "compile":
        pid = _fork(lambda: _load(src, keep_intermediates=keep), tmp_path / "result.json")
        _wait_for(lambda: _compiler_running(fresh_cache), pid, "the compiler to start")
        _kill(pid)
    else:
        pid, _, _ = _pause_at(point, lambda: _load(src, keep_intermediates=keep), tmp_path, monkeypatch)
        _kill(pid)
    _assert_sound()
    _reset()
    art = _load(src, keep_intermediates=keep)  # the next load succeeds (a build, or a hit)
    infos = _assert_sound()
    assert any(i.key == art.key for i in infos)
    if point in ("build:published", "state:warm"):
        assert not art.built  # the artifact was already whole: nothing is rebuilt


# -- a full disk ---------------------------------------------------------------------------------------
@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs, or None where this process cannot mount one."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if not IS_ROOT:
        yield None
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", os.fspath(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", os.fspath(mnt)], check=False)


def _fill(fs: pathlib.Path, leave: int = 0) -> pathlib.Path:
    """Fill ``fs`` until fewer than ``leave`` bytes are free (a file at the top of it)."""
    filler = fs / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
                if free <= leave:
                    break
                f.write(b"\0" * min(65536, max(4096, free - leave)))
                f.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def _assert_disk_error(msg: str, directory: pathlib.Path) -> None:
    assert "no space left on" in msg.lower(), msg
    assert os.fspath(directory) in msg, msg
    assert " free" in msg, msg


def _nothing_partial(root: pathlib.Path) -> None:
    assert "library" not in [i.kind for i in _assert_sound()]  # no artifact entry, and the rest whole
    leftovers = [p.name for p in (root / "tmp").iterdir()] if (root / "tmp").is_dir() else []
    assert not [n for n in leftovers if n.startswith(("put-", "build-"))], leftovers


def test_full_disk_while_opsmith_publishes(tmp_path, small_fs, monkeypatch):
    """tmpfs variant: the disk fills while the build is paused after compiling; the artifact's
    publish then fails. Fallback: ENOSPC injected into the store's manifest write."""
    if small_fs is not None:
        root = small_fs / "cache"
        monkeypatch.setenv("OPSMITH_CACHE_DIR", os.fspath(root))
        _reset()
        pid, marker, result = _pause_at("build:objects-published", lambda: _build(keep_intermediates=False),
                                        tmp_path, monkeypatch)
        filler = _fill(small_fs)
        marker.unlink()  # go on, into a full disk
        os.waitpid(pid, 0)
        res = json.loads(result.read_text())
        assert res["type"] == "CacheError", res
        _assert_disk_error(res["msg"], root)
    else:
        root = pathlib.Path(os.environ["OPSMITH_CACHE_DIR"])
        real = pathlib.Path.write_text

        def full(self, *a, **k):
            if "/tmp/put-" in os.fspath(self):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(self))
            return real(self, *a, **k)
        monkeypatch.setattr(pathlib.Path, "write_text", full)
        with pytest.raises(CacheError) as err:
            _build(keep_intermediates=False)
        _assert_disk_error(str(err.value), root)
        monkeypatch.setattr(pathlib.Path, "write_text", real)
        filler = None
    _reset()
    _nothing_partial(root)
    if filler is not None:
        filler.unlink()
    _load()
    _assert_sound()


def test_full_disk_while_the_compiler_writes(tmp_path, small_fs, monkeypatch):
    """tmpfs variant: paused before ninja starts, the disk is filled to 64 KiB free; the
    compiler cannot write its object. Fallback: a compiler wrapper that fails with
    "No space left on device" on its output file."""
    if small_fs is not None:
        root = small_fs / "cache"
        monkeypatch.setenv("OPSMITH_CACHE_DIR", os.fspath(root))
        _reset()
        pid, marker, result = _pause_at("build:before-compile", lambda: _build(SLOW_SRC), tmp_path, monkeypatch)
        filler = _fill(small_fs, leave=64 * 1024)
        marker.unlink()
        os.waitpid(pid, 0)
        res = json.loads(result.read_text())
    else:
        root = pathlib.Path(os.environ["OPSMITH_CACHE_DIR"])
        wrapper = tmp_path / "fullcc"
        wrapper.write_text('#!/bin/sh\nfor a; do o=$a; done\n'
                           'echo "cc1plus: fatal error: error writing to $o: No space left on device" >&2\n'
                           'exit 1\n')
        wrapper.chmod(0o755)
        monkeypatch.setenv("CXX", os.fspath(wrapper))
        try:
            _build(SLOW_SRC)
            res = {"ok": True}
        except Exception as exc:  # noqa: BLE001 - checked below
            res = {"type": type(exc).__name__, "msg": str(exc)}
        monkeypatch.delenv("CXX")
        filler = None
    assert res.get("type") == "CacheError", res
    _assert_disk_error(res["msg"], root)
    _reset()
    _nothing_partial(root)
    if filler is not None:
        filler.unlink()
    _load(SLOW_SRC)
    _assert_sound()


# -- a read-only cache ------------------------------------------------------------------------------
def _mounted_read_only(root: pathlib.Path) -> bool:
    r = subprocess.run(["mount", "--bind", os.fspath(root), os.fspath(root)], capture_output=True)
    if r.returncode != 0:
        return False
    r = subprocess.run(["mount", "-o", "remount,bind,ro", os.fspath(root)], capture_output=True)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", os.fspath(root)], check=False)
        return False
    return True


def test_read_only_cache_serves_hits_and_refuses_builds_clearly(fresh_cache):
    art = _load()
    modes = {p: os.stat(p).st_mode for p in (fresh_cache, *fresh_cache.rglob("*")) if p.is_dir()}
    if IS_ROOT:
        if not _mounted_read_only(fresh_cache):
            pytest.skip("root, and no read-only bind mount here: os.access ignores mode bits for root, "
                        "so chmod cannot make the cache read-only")
        undo = lambda: subprocess.run(["umount", "-l", os.fspath(fresh_cache)], check=False)  # noqa: E731
        why = "read-only filesystem"
    else:
        for p in modes:
            os.chmod(p, 0o500)
        undo = lambda: [os.chmod(p, m) for p, m in modes.items()]  # noqa: E731
        why = "not writable"
    try:
        _reset()
        hit = _load()  # a warm hit is served
        assert not hit.built and hit.path == art.path
        with pytest.raises(CacheError) as err:
            _build(SRC.replace("42", "42 + 0"), name="fx2")
        msg = str(err.value)
        assert os.fspath(fresh_cache) in msg and "OPSMITH_CACHE_DIR" in msg and why in msg, msg
        if IS_ROOT:
            assert "chmod" not in msg  # chmod cannot fix a read-only filesystem
        assert {p: os.stat(p).st_mode for p in modes} == modes or not IS_ROOT  # nothing was chmod'ed
    finally:
        undo()
    if IS_ROOT:
        assert {p: os.stat(p).st_mode for p in modes} == modes


# -- a flipped bit --------------------------------------------------------------------------------
def _flip(path: pathlib.Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def _entry(kind: str):
    return next(i for i in _store().list() if i.kind == kind)


@pytest.mark.parametrize("target", ["artifact", "manifest-hash", "manifest-name", "object"])
def test_a_flipped_bit_is_detected_rebuilt_and_never_loaded(target, fresh_cache):
    first = _load()
    link = _entry("library")
    obj = _entry("object")
    if target == "artifact":
        f = pathlib.Path(first.path)
        _flip(f, f.stat().st_size // 2)
    elif target.startswith("manifest"):
        m = link.path / "manifest.json"
        text = m.read_text()
        # a hex digit of a file's sha256, or a letter of the entry's name (valid JSON either way)
        at = text.index('"sha256": "') + 20 if target == "manifest-hash" else text.index('"name": "fx"') + 10
        _flip(m, at)
        assert json.loads(m.read_text())  # still parses: only a check of its own content catches it
    else:
        _flip(obj.path / "unit.o", 200)
        assert _store().get(obj.key) is None  # detected (and removed)
        _store().remove(link.key)  # so that the next build needs the object
    assert _store().verify(link.key if target != "object" else obj.key) is not None or target == "object"
    _reset()
    if target == "artifact":  # through load_inline: the warm index sees the new ctime, the store the hash
        ino = os.stat(first.path).st_ino
        art = _load()
        assert os.stat(art.path).st_ino != ino  # a new file: rebuilt, the flipped one never loaded
    else:
        art = _build()
        assert art.built
        if target == "object":
            assert art.compiled_units == 1  # the corrupt object was recompiled, not linked
        _load()
    _assert_sound()
    assert _store().get(art.key) is not None


# -- foreign and world-writable directories -------------------------------------------------------------
@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_an_entry_owned_by_another_user_is_refused(fresh_cache):
    _load()
    link = _entry("library")
    for p in (link.path, *link.path.rglob("*")):
        os.chown(p, 12345, 12345)
    _reset()
    with pytest.raises(CacheError, match=r"belongs to uid 12345.*OPSMITH_CACHE_DIR"):
        _load()


def test_a_world_writable_cache_directory_is_refused(fresh_cache):
    _load()
    os.chmod(fresh_cache, 0o777)
    _reset()
    with pytest.raises(CacheError, match=r"writable by other users.*chmod 700"):
        _load()
    os.chmod(fresh_cache, 0o700)
    _reset()
    _load()
