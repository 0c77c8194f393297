"""The remote tier's RESP reads (opsmith._cache._resp) against a real redis-server, and the
compiler probe that a remote hit needs (the key) split from the one only a build needs."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from opsmith._cache import _resp
from opsmith._cache._redis import RedisRemote, RemoteDown

REDIS_SERVER = shutil.which("redis-server")
needs_server = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed "
                                  "(scripts/setup.sh --test installs it with apt-get)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """A redis-server with a password and a user ``bob`` (password ``b@b/pw``)."""
    port = _free_port()
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", os.fspath(tmp_path),
                             "--requirepass", "s3cret"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    conn = _resp.RespConnection(f"redis://:s3cret@127.0.0.1:{port}/0", connect_timeout=0.2, timeout=1.0)
    while True:
        try:
            conn.command("PING")
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    conn.command("ACL", "SETUSER", "bob", "on", ">b@b/pw", "~*", "+@all")
    yield port, conn
    proc.kill()
    proc.wait()


def test_supports_plain_urls_only():
    assert _resp.supports("redis://127.0.0.1:6379/0")
    assert _resp.supports("redis://u:p@host/3")
    assert _resp.supports("redis://host")
    assert _resp.supports("unix:///run/redis.sock")
    assert not _resp.supports("rediss://host:6380/0")          # TLS: redis-py
    assert not _resp.supports("redis://host/0?socket_keepalive=1")  # options: redis-py
    assert not _resp.supports("redis://host:notaport/0")
    assert not _resp.supports("redis://host/zero")


@needs_server
def test_reads_match_the_server(server):
    port, admin = server
    admin.command("SET", "k", b"\x00\xffbinary\r\n")
    admin.command("SELECT", "2")
    admin.command("SET", "k", b"in db 2")
    c = _resp.RespConnection(f"redis://bob:b%40b%2Fpw@127.0.0.1:{port}/2", connect_timeout=0.2, timeout=1.0)
    assert c.command("GET", "k") == b"in db 2"
    assert c.command("GET", "missing") is None
    assert c.command("EXISTS", "k") == 1
    assert c.command("GETEX", "k", "PX", 60000) == b"in db 2"
    assert 0 < c.command("PTTL", "k") <= 60000
    admin.command("SELECT", "0")
    big = os.urandom(3 << 20)
    admin.command("SET", "big", big)
    assert c.command("GET", "big") is None  # db 2 has no "big": SELECT took effect
    c0 = _resp.RespConnection(f"redis://:s3cret@127.0.0.1:{port}", connect_timeout=0.2, timeout=1.0)
    assert c0.command("GET", "k") == b"\x00\xffbinary\r\n"
    assert c0.command("GET", "big") == big
    with pytest.raises(_resp.RespError, match="not an integer"):
        c0.command("INCR", "k")
    assert c0.command("GET", "k") == b"\x00\xffbinary\r\n"  # still in sync after an error reply


@needs_server
def test_remote_reads_fail_open(server, tmp_path):
    port, admin = server
    admin.command("SET", "opsmith:{abc}:entry", b"bundle")
    ok = RedisRemote(f"redis://:s3cret@127.0.0.1:{port}/0")
    assert ok.get_bundle("abc") == b"bundle" and ok.has_bundle("abc") and not ok.has_bundle("x")
    bad = RedisRemote(f"redis://:wrong@127.0.0.1:{port}/0")
    with pytest.raises(RemoteDown, match="WRONGPASS|invalid"):
        bad.get_bundle("abc")
    down = RedisRemote(f"redis://127.0.0.1:{_free_port()}/0", connect_timeout=0.2)
    t0 = time.monotonic()
    for _ in range(3):
        with pytest.raises(RemoteDown):
            down.get_record("deps", "x")
    with pytest.raises(RemoteDown, match="circuit breaker"):
        down.get_bundle("abc")
    assert time.monotonic() - t0 < 2.0


@needs_server
def test_a_remote_hit_does_not_import_redis_py(server):
    port, admin = server
    admin.command("SET", "opsmith:{abc}:entry", b"bundle")
    code = ("import sys\nfrom opsmith._cache._redis import RedisRemote\n"
            f"r = RedisRemote('redis://:s3cret@127.0.0.1:{port}/0')\n"
            "assert r.get_bundle('abc') == b'bundle'\nprint('redis' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_key_probe_leaves_the_search_dirs_for_a_build(fresh_cache):
    from opsmith._cache._open import open_cache
    from opsmith._toolchain import _cxx
    state = open_cache().state
    comp = _cxx.find_cxx(state)
    assert comp.system_dirs is None and comp.fingerprint
    dirs = _cxx.search_dirs(comp, state)
    assert dirs and all(os.path.isdir(d) for d in dirs)
    _cxx._search_dirs_cached.cache_clear()
    assert _cxx.search_dirs(comp, state) == dirs  # from the machine-local record


@pytest.mark.parametrize("text, value", [("1048576", 1 << 20), ("64K", 64 << 10), ("256M", 256 << 20),
                                         ("256MiB", 256 << 20), ("1G", 1 << 30), (" 2 mb ", 2 << 20)])
def test_max_entry_setting_reads_sizes(monkeypatch, text, value):
    from opsmith._config import settings
    assert settings.remote_max_entry == 256 << 20
    monkeypatch.setenv("OPSMITH_REMOTE_MAX_ENTRY", text)
    assert settings.remote_max_entry == value


@pytest.mark.parametrize("text", ["0", "-1", "1.5M", "12T", "lots"])
def test_max_entry_setting_refuses_nonsense(monkeypatch, text):
    from opsmith._config import settings
    from opsmith._errors import ConfigError
    monkeypatch.setenv("OPSMITH_REMOTE_MAX_ENTRY", text)
    with pytest.raises(ConfigError, match="OPSMITH_REMOTE_MAX_ENTRY.*64K, 256M or 1G"):
        _ = settings.remote_max_entry


@needs_server
def test_entries_over_the_limit_are_neither_read_nor_published(server, monkeypatch, tmp_path, caplog):
    """A real server's reply over OPSMITH_REMOTE_MAX_ENTRY is a failure (both readers); an entry
    at the limit reads; a build over it is not published."""
    port, admin = server
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    admin.command("SET", "opsmith:{big}:entry", b"x" * 4096)
    admin.command("SET", "opsmith:{fits}:entry", b"y" * 1024)
    for reads in (url, url + "?socket_keepalive=1"):  # the RESP reader, then redis-py
        remote = RedisRemote(reads, max_entry=1024)
        assert remote.get_bundle("fits") == b"y" * 1024
        with pytest.raises(RemoteDown, match="OPSMITH_REMOTE_MAX_ENTRY"):
            remote.get_bundle("big")
    from opsmith._cache._open import open_cache
    from opsmith._cache._tiered import TieredStore
    monkeypatch.setenv("OPSMITH_REMOTE_CACHE", url)
    monkeypatch.setenv("OPSMITH_REMOTE_TRUST_UNSIGNED", "1")
    monkeypatch.setenv("OPSMITH_REMOTE_MAX_ENTRY", "1K")
    store = open_cache().store
    assert isinstance(store, TieredStore)
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(4096))
    with caplog.at_level("WARNING", logger="opsmith.cache"):
        store.put("k" * 64, {"blob.bin": blob}, kind="test", name="blob")
    assert "OPSMITH_REMOTE_MAX_ENTRY" in caplog.text and "did not publish" in caplog.text
    assert admin.command("EXISTS", "opsmith:{%s}:entry" % ("k" * 64)) == 0
    assert store.get("k" * 64) is not None  # kept locally
