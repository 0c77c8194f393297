"""NVRTC's identity in cache keys travels: two machines that installed the same NVRTC
separately (other paths, other mtimes) share kernels through the shared cache.

A "machine" is a cache directory used by its own process, with its own copy of libnvrtc
loaded (preloaded with ctypes, so that cuda-bindings finds it already in the process).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opsmith._errors import ToolchainError

REDIS_SERVER = shutil.which("redis-server")


def _loaded_libnvrtc() -> str | None:
    """The libnvrtc file this process has mapped, once NVRTC is loaded (Linux)."""
    try:
        from opsmith._build._nvrtc import nvrtc_version
        nvrtc_version()
    except (ImportError, ToolchainError):
        return None
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rstrip("\n").split(None, 5)[-1]
            if "/libnvrtc.so" in path:
                return path
    return None


LIBNVRTC = _loaded_libnvrtc()
needs_nvrtc = pytest.mark.skipif(LIBNVRTC is None, reason="NVRTC is not loadable here "
                                 "(pip install 'opsmith[cuda]') or /proc/self/maps does not name it")
try:
    import redis  # noqa: F401
    _REDIS_PY = None
except ImportError as exc:
    _REDIS_PY = f"the redis package is not installed ({exc}); pip install 'opsmith[test]'"
needs_redis = pytest.mark.skipif(REDIS_SERVER is None or _REDIS_PY is not None,
                                 reason=_REDIS_PY or "redis-server is not installed")

KERNEL = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'

# One "process on a machine": preload its own libnvrtc, compile (or load) KERNEL, report.
WORKER = textwrap.dedent("""
    import ctypes, hashlib, json, os, sys
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)  # this machine's copy: cuda-bindings takes it
    from opsmith._build import _nvrtc
    b = _nvrtc.compile_cuda(sys.argv[2], arch="sm_90")
    with open("/proc/self/maps") as f:
        libs = sorted({l.split()[-1] for l in f if "/libnvrtc.so" in l})
    print(json.dumps({"compiles": _nvrtc.nvrtc_stats["compiles"], "key": b.key, "libs": libs,
                      "code": hashlib.sha256(b.code).hexdigest(), "from_cache": b.from_cache}))
""")


def _machine_lib(root: Path, mtime: float) -> Path:
    """A copy of this NVRTC installed at ``root`` (builtins beside it, as its $ORIGIN rpath wants)."""
    lib = root / "lib"
    lib.mkdir(parents=True)
    src = Path(LIBNVRTC)
    dst = lib / src.name
    shutil.copyfile(src, dst)
    os.utime(dst, (mtime, mtime))
    for builtins in src.parent.glob("libnvrtc-builtins*"):
        (lib / builtins.name).symlink_to(builtins)
    return dst


@pytest.fixture
def redis_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", os.fspath(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis as redis_py
    deadline = time.monotonic() + 10
    while True:
        try:
            redis_py.Redis(port=port, socket_connect_timeout=0.2).ping()
            break
        except redis_py.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.kill()
    proc.wait()


def _run(machine: Path, lib: Path, url: str, key_file: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSMITH_")}
    env.update(OPSMITH_CACHE_DIR=os.fspath(machine / "cache"), OPSMITH_REMOTE_CACHE=url,
               OPSMITH_REMOTE_KEY_FILE=os.fspath(key_file), OPSMITH_LOG_LEVEL="WARNING")
    p = subprocess.run([sys.executable, "-c", WORKER, os.fspath(lib), KERNEL], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@needs_nvrtc
@needs_redis
def test_two_machines_with_separately_installed_nvrtc_share_a_kernel(tmp_path, redis_url):
    key_file = tmp_path / "cluster.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    key_file.chmod(0o600)
    lib_a = _machine_lib(tmp_path / "a", mtime=1_600_000_000)
    lib_b = _machine_lib(tmp_path / "b", mtime=1_700_000_000)
    a = _run(tmp_path / "a", lib_a, redis_url, key_file)
    b = _run(tmp_path / "b", lib_b, redis_url, key_file)
    assert a["libs"] == [os.fspath(lib_a)] and b["libs"] == [os.fspath(lib_b)]  # each its own copy
    assert a["compiles"] == 1 and not a["from_cache"]
    assert b["compiles"] == 0 and b["from_cache"], b  # through Redis: nothing compiled on b
    assert b["key"] == a["key"] and b["code"] == a["code"]


# -- the identity itself (no NVRTC needed: fake library files) -------------------------------------
@pytest.fixture
def fake_libs(tmp_path, monkeypatch):
    """Point the identity at a fake libnvrtc file; returns a function that installs one."""
    from opsmith._build import _nvrtc_identity
    loaded = {"path": None, "loads": 0}
    monkeypatch.setattr(_nvrtc_identity, "loaded_nvrtc_path", lambda: loaded["path"])

    def version() -> str:
        loaded["loads"] += 1
        return "13.5"

    def install(path: Path, content: bytes, mtime: float) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.utime(path, (mtime, mtime))
        loaded["path"] = os.fspath(path)
        return path
    return install, version, loaded


def _identity(state_dir: Path, version):
    from opsmith._build import _nvrtc_identity
    from opsmith._cache._state import State
    from opsmith._config import reset
    reset()  # a new process: nothing remembered in memory
    return _nvrtc_identity.nvrtc_identity(State(state_dir), version)


def test_the_identity_is_version_and_content_not_path_or_mtime(tmp_path, fake_libs):
    install, version, loaded = fake_libs
    body = os.urandom(4096)  # no ELF build ID: the file's sha256
    install(tmp_path / "a/lib/libnvrtc.so.13", body, 1_600_000_000)
    a = _identity(tmp_path / "state-a", version)
    install(tmp_path / "b/other/libnvrtc.so.13", body, 1_700_000_000)
    b = _identity(tmp_path / "state-b", version)
    assert a.path != b.path and (a.version, a.content) == (b.version, b.content)
    assert a.version == "13.5" and a.content.startswith("sha256:") and len(a.content) == 7 + 64
    install(tmp_path / "c/lib/libnvrtc.so.13", body[:-1] + bytes([body[-1] ^ 1]), 1_600_000_000)
    assert _identity(tmp_path / "state-c", version).content != a.content  # another build


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to link test libraries")
def test_an_elf_library_is_known_by_its_build_id(tmp_path, fake_libs):
    """Linked libraries carry a build ID (a hash of their contents, written by the linker):
    the same one at two paths is one identity, another link is another, without hashing."""
    install, version, loaded = fake_libs

    def link(body: str) -> bytes:
        src, out = tmp_path / "lib.c", tmp_path / "lib.so"
        src.write_text(body)
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,--build-id=sha1", "-o", str(out), str(src)],
                       check=True, capture_output=True)
        return out.read_bytes()
    one, two = link("int f(void) { return 1; }\n"), link("int f(void) { return 2; }\n")
    from opsmith._build._nvrtc_identity import elf_build_id
    install(tmp_path / "a/libnvrtc.so.13", one, 1_600_000_000)
    a = _identity(tmp_path / "state-a", version)
    assert a.content == f"build-id:{elf_build_id(a.path)}:{len(one)}" and len(elf_build_id(a.path)) == 40
    install(tmp_path / "b/libnvrtc.so.13", one, 1_700_000_000)
    assert _identity(tmp_path / "state-b", version).content == a.content
    install(tmp_path / "c/libnvrtc.so.13", two, 1_600_000_000)
    assert _identity(tmp_path / "state-c", version).content != a.content


def test_the_identity_is_remembered_by_the_files_stamp(tmp_path, fake_libs):
    install, version, loaded = fake_libs
    lib = install(tmp_path / "lib/libnvrtc.so.13", b"one build", 1_600_000_000)
    first = _identity(tmp_path / "state", version)
    assert loaded["loads"] == 1
    assert _identity(tmp_path / "state", version) == first and loaded["loads"] == 1  # a stat, no load
    lib.write_bytes(b"two build")  # rewritten in place, same size, mtime put back
    os.utime(lib, (1_600_000_000, 1_600_000_000))
    second = _identity(tmp_path / "state", version)
    assert loaded["loads"] == 2 and second.content != first.content


def test_an_unknown_library_file_is_keyed_by_version_and_asked_each_time(tmp_path, fake_libs):
    install, version, loaded = fake_libs
    loaded["path"] = None  # /proc/self/maps did not name it (not Linux, or a static NVRTC)
    one = _identity(tmp_path / "state", version)
    two = _identity(tmp_path / "state", version)
    assert one.content is None and one.version == "13.5" and loaded["loads"] == 2
    assert one == two


@needs_nvrtc
def test_the_real_libnvrtc_is_known_by_its_build_id():
    from opsmith._build._nvrtc_identity import content_id, elf_build_id
    build_id = elf_build_id(LIBNVRTC)
    if build_id is None:
        pytest.skip(f"{LIBNVRTC} has no GNU build ID: it is keyed by its sha256")
    assert content_id(LIBNVRTC, os.path.getsize(LIBNVRTC)) == f"build-id:{build_id}:{os.path.getsize(LIBNVRTC)}"
