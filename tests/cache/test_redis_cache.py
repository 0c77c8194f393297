"""The cluster cache against a real redis-server: signing, leases, fail-open, must-hit, bundles.

Two "machines" are two cache directories used by separate processes (tests/redis_worker.py);
the server is started per test module on a free loopback port, without persistence.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsmith._errors import CacheError

REDIS_SERVER = shutil.which("redis-server")
try:
    import redis  # noqa: F401
    _REDIS_PY = None
except ImportError as exc:
    _REDIS_PY = f"the redis package is not installed ({exc}); pip install 'opsmith[test]'"

needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None or _REDIS_PY is not None,
    reason=_REDIS_PY or "redis-server is not installed (scripts/setup.sh --test installs it with apt-get)")

WORKER = os.fspath(Path(__file__).resolve().parents[1] / "redis_worker.py")


def _nvrtc_reason() -> str | None:
    try:
        from opsmith._build._nvrtc import nvrtc_version
        nvrtc_version()
    except Exception as exc:  # ToolchainError: no cuda-bindings / libnvrtc
        return f"NVRTC is not available: {exc}"
    return None


def _kernel(tag: str) -> str:
    return f'extern "C" __global__ void k_{tag}(float* x) {{ x[threadIdx.x] *= 2.0f; }}\n'


class RedisServer:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", os.fspath(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def client(self):
        import redis
        return redis.Redis(port=self.port)


@pytest.fixture
def server(tmp_path):
    srv = RedisServer(tmp_path)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "cluster.key"
    path.write_bytes(os.urandom(32).hex().encode() + b"\n")
    path.chmod(0o600)
    return path


def _env(machine: Path, server, key_file, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSMITH_")}
    env.update(OPSMITH_CACHE_DIR=os.fspath(machine), OPSMITH_REMOTE_CACHE=server.url,
               OPSMITH_REMOTE_KEY_FILE=os.fspath(key_file), OPSMITH_REMOTE_PREFIX="t",
               OPSMITH_LOG_LEVEL="WARNING")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _spawn(mode: str, args, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, mode, *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _result(proc: subprocess.Popen, timeout: float = 120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1]) | {"stderr": err}


def _tiered(root: Path, server, signer, **kw):
    from opsmith._cache._local import LocalStore
    from opsmith._cache._redis import RedisRemote
    from opsmith._cache._tiered import TieredStore
    return TieredStore(LocalStore(root), RedisRemote(server.url, prefix="t", **kw), signer=signer)


def _put(store, key: str, tmp: Path, data: bytes = b"native code"):
    f = tmp / f"{key[:8]}.so"
    f.write_bytes(data)
    return store.put(key, {"lib.so": f}, kind="library", name="demo")


# -- bundles (no server) ------------------------------------------------------------------------
def test_bundle_round_trip_and_refusals(tmp_path):
    from opsmith._cache._bundle import Refused, Signer, pack, unpack
    ours, theirs = Signer(b"a" * 32), Signer(b"b" * 32)
    files = {"lib.so": b"\x7fELF code", "meta.json": b"{}"}
    manifest = {"kind": "library", "name": "x", "meta": {"file": "lib.so"}, "created": 1.0,
                "files": {n: {"sha256": __import__("hashlib").sha256(d).hexdigest(), "size": len(d)}
                          for n, d in files.items()}}
    data = pack("k1", manifest, files, ours)
    got = unpack(data, "k1", signer=ours, trust_unsigned=False)
    assert got.files == files and got.signed and got.manifest["meta"] == {"file": "lib.so"}
    cases = {
        "flipped byte": data[:-1] + bytes([data[-1] ^ 1]),
        "truncated": data[:-3],
        "wrong key id": pack("k1", manifest, files, theirs),
        "unsigned": pack("k1", manifest, files, None),
    }
    for what, bad in cases.items():
        with pytest.raises(Refused):
            unpack(bad, "k1", signer=ours, trust_unsigned=False)
    with pytest.raises(Refused, match="entry of k1"):  # moved to another key
        unpack(data, "k2", signer=ours, trust_unsigned=False)
    # a header rewritten to name the other key keeps the old HMAC: refused
    forged = data.replace(b'"key":"k1"', b'"key":"k2"')
    with pytest.raises(Refused, match="wrong signature"):
        unpack(forged, "k2", signer=ours, trust_unsigned=False)
    # the unsigned policy: refused without a key unless the user opts in
    with pytest.raises(Refused, match="TRUST_UNSIGNED"):
        unpack(pack("k1", manifest, files, None), "k1", signer=None, trust_unsigned=False)
    assert unpack(pack("k1", manifest, files, None), "k1", signer=None, trust_unsigned=True).files == files


def test_key_file_checks(tmp_path):
    from opsmith._cache._bundle import Signer
    from opsmith._errors import ConfigError
    short = tmp_path / "short"
    short.write_bytes(b"tiny")
    with pytest.raises(ConfigError, match="at least 16"):
        Signer.from_file(short)
    shared = tmp_path / "shared"
    shared.write_bytes(b"x" * 32)
    shared.chmod(0o666)
    with pytest.raises(ConfigError, match="chmod 600"):
        Signer.from_file(shared)
    with pytest.raises(ConfigError, match="cannot read"):
        Signer.from_file(tmp_path / "missing")


def test_must_hit_names_key_and_reason(tmp_path):
    from opsmith._cache._tiered import check_must_hit
    from opsmith._config import settings
    check_must_hit("abc", "compiling x")  # off by default: nothing happens
    with settings.override(must_hit=True):
        with pytest.raises(CacheError, match=r"Cache key abc missed: not in the shared cache"):
            check_must_hit("abc", "compiling x", "not in the shared cache")


@pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))
def test_must_hit_raises_on_an_nvrtc_miss_and_passes_on_a_hit():
    import opsmith
    from opsmith._config import settings
    src = _kernel("musthit")
    with settings.override(must_hit=True):
        with pytest.raises(CacheError, match=r"must-hit mode.*compiling kernel\.cu with NVRTC.*Cache key [0-9a-f]{32}"):
            opsmith.compile_cuda(src, arch="sm_90")
    opsmith.compile_cuda(src, arch="sm_90")
    from opsmith._build import _nvrtc
    _nvrtc._memo.clear()
    with settings.override(must_hit=True):
        assert opsmith.compile_cuda(src, arch="sm_90").from_cache


# -- the tiered store against a real server -----------------------------------------------------
@needs_redis
def test_remote_hit_is_verified_and_written_locally(tmp_path, server):
    from opsmith._cache._bundle import Signer
    signer = Signer(b"s" * 32)
    a, b = _tiered(tmp_path / "a", server, signer), _tiered(tmp_path / "b", server, signer)
    key = "1" * 32
    _put(a, key, tmp_path)
    entry = b.get(key)
    assert entry is not None and entry.file("lib.so").read_bytes() == b"native code"
    assert b.local.get(key) is not None  # written into machine B's local store
    b.flush_stats()
    from opsmith._cache._tiered import tier_stats
    tiers = tier_stats(tmp_path / "b")["tiers"]
    assert tiers["remote"]["hits"] == 1 and tiers["local"]["misses"] == 1


@needs_redis
def test_tampered_entries_are_refused(tmp_path, server, caplog):
    from opsmith._cache._bundle import Signer
    signer = Signer(b"s" * 32)
    a = _tiered(tmp_path / "a", server, signer)
    r = server.client()
    k1, k2, k3 = "a" * 32, "b" * 32, "c" * 32
    _put(a, k1, tmp_path, b"code one")
    _put(a, k2, tmp_path, b"code two")
    good1, good2 = r.get(f"t:{{{k1}}}:entry"), r.get(f"t:{{{k2}}}:entry")
    forger = _tiered(tmp_path / "f", server, Signer(b"x" * 32))

    def refused(key: str, value: bytes, n: int) -> None:
        r.set(f"t:{{{key}}}:entry", value)
        b = _tiered(tmp_path / f"b{n}", server, signer)
        with caplog.at_level(logging.WARNING, logger="opsmith.cache"):
            assert b.get(key) is None
        assert b.local.get(key) is None, "a refused entry must never reach the local store"
        assert b._counts["remote"]["refused"] == 1
        assert f"refused the shared cache's entry {key}" in caplog.text

    refused(k1, good1[:-1] + bytes([good1[-1] ^ 0x40]), 1)            # flipped byte
    _put(forger, k3, tmp_path, b"evil")                                 # signed with another key
    refused(k3, r.get(f"t:{{{k3}}}:entry"), 2)
    refused(k1, good2, 3)                                                 # files swapped between keys
    refused(k2, good1, 4)                                                 # an older entry replayed
    from opsmith._cache._bundle import pack
    import hashlib
    manifest = {"kind": "library", "files": {"lib.so": {"sha256": hashlib.sha256(b"x").hexdigest(), "size": 1}}}
    refused(k3, pack(k3, manifest, {"lib.so": b"x"}, None), 5)        # unsigned


@needs_redis
def test_fencing_token_refuses_an_expired_builder(tmp_path, server):
    from opsmith._cache._redis import RedisRemote
    r1 = RedisRemote(server.url, prefix="t", lease_seconds=60)
    r2 = RedisRemote(server.url, prefix="t", lease_seconds=5)
    key = "f" * 32
    t1, _ = r1.try_acquire(key)
    assert t1 and r2.try_acquire(key)[0] == 0      # held
    # r1's lease expires (it did not renew): its TTL cut to 1 ms by hand, not slept for, so that
    # a busy machine cannot let it expire before the check above
    lease = f"t:{{{key}}}:lease"
    assert server.client().pexpire(lease, 1)
    deadline = time.monotonic() + 30
    while server.client().exists(lease):
        assert time.monotonic() < deadline, "redis did not expire the lease"
        time.sleep(0.01)
    t2, _ = r2.try_acquire(key)
    assert t2 > t1
    assert r1.put_bundle(key, b"stale", t1) is False
    assert r2.put_bundle(key, b"fresh", t2) is True
    assert server.client().get(f"t:{{{key}}}:entry") == b"fresh"


@needs_redis
def test_redis_down_fails_open_fast(tmp_path, server, caplog):
    from opsmith._cache._bundle import Signer
    store = _tiered(tmp_path / "a", server, Signer(b"s" * 32))
    server.stop()
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="opsmith.cache"):
        for i in range(10):
            assert store.get(f"{i:032x}") is None
            with store.build_lease(f"{i:032x}"):
                _put(store, f"{i:032x}", tmp_path)   # published locally; the remote put fails open
    assert time.perf_counter() - t0 < 5.0
    assert store.local.get(f"{3:032x}") is not None
    assert caplog.text.count("did not answer") <= 1  # one warning per process
    assert store._counts["remote"]["errors"] >= 3


@needs_redis
def test_no_key_means_the_remote_is_unused(tmp_path, server, caplog):
    from opsmith._cache._local import LocalStore
    from opsmith._cache._redis import RedisRemote
    from opsmith._cache._tiered import TieredStore
    with caplog.at_level(logging.WARNING, logger="opsmith.cache"):
        store = TieredStore(LocalStore(tmp_path / "a"), RedisRemote(server.url, prefix="t"))
    assert "is not used" in caplog.text
    _put(store, "d" * 32, tmp_path)
    assert server.client().keys("t:*") == []  # nothing published unsigned


# -- processes on two machines ------------------------------------------------------------------
nvrtc_needed = pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))


@needs_redis
@nvrtc_needed
def test_32_processes_on_two_machines_compile_once(tmp_path, server, key_file):
    src = _kernel("herd")
    envs = [_env(tmp_path / m, server, key_file) for m in ("machine-a", "machine-b")]
    procs = [_spawn("nvrtc", [src], envs[i % 2]) for i in range(32)]
    results = [_result(p) for p in procs]
    assert sum(r["compiles"] for r in results) == 1, [r["compiles"] for r in results]
    assert len({r["codes"][0] for r in results}) == 1
    for m in ("machine-a", "machine-b"):
        from opsmith._cache._local import LocalStore
        store = LocalStore(tmp_path / m)
        assert all(store.verify(e.key) is None for e in store.list())


@needs_redis
@nvrtc_needed
def test_killed_builder_is_taken_over(tmp_path, server, key_file):
    src = _kernel("killed")
    a = _env(tmp_path / "machine-a", server, key_file, OPSMITH_REMOTE_LEASE=1)
    b = _env(tmp_path / "machine-b", server, key_file, OPSMITH_REMOTE_LEASE=1)
    victim = _spawn("hang", [src], a)
    assert json.loads(victim.stdout.readline()) == {"holding": True}  # inside the compile, lease held
    assert server.client().keys("t:*:lease")
    waiter = _spawn("nvrtc", [src], b)
    time.sleep(1.0)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    res = _result(waiter)
    assert res["compiles"] == 1
    again = _result(_spawn("nvrtc", [src], a))    # machine A: the taken-over build, from Redis
    assert again["compiles"] == 0 and again["codes"] == res["codes"]
    from opsmith._cache._local import LocalStore
    store = LocalStore(tmp_path / "machine-a")
    assert [store.verify(e.key) for e in store.list()] == [None]


@needs_redis
@nvrtc_needed
def test_redis_killed_and_restarted_mid_run(tmp_path, server, key_file):
    srcs = [_kernel(f"restart{i}") for i in range(6)]
    envs = [_env(tmp_path / m, server, key_file) for m in ("machine-a", "machine-b")]
    first = [_spawn("nvrtc", srcs[:3], envs[i % 2]) for i in range(4)]
    server.stop()                                   # dies while they run
    second = [_spawn("nvrtc", srcs, envs[i % 2]) for i in range(4)]
    time.sleep(1.0)
    server.start()                                  # back, empty (no persistence)
    third = [_spawn("nvrtc", srcs, envs[i % 2]) for i in range(4)]
    results = [_result(p) for p in first + second + third]
    for r in results:
        assert r["seconds"] < 60
    by_src: dict[int, set] = {}
    for r in results:
        for i, code in enumerate(r["codes"]):
            by_src.setdefault(i, set()).add(code)
    assert all(len(codes) == 1 for codes in by_src.values())
    from opsmith._cache._local import LocalStore
    for m in ("machine-a", "machine-b"):
        store = LocalStore(tmp_path / m)
        assert all(store.verify(e.key) is None for e in store.list())


@needs_redis
def test_extension_built_on_a_loads_on_b_without_compiling(tmp_path, server, key_file):
    src = 'extern "C" int tiny_add(int a, int b) { return a + b; }\n'
    built = _result(_spawn("ext", ["tiny", src], _env(tmp_path / "machine-a", server, key_file)))
    assert built["built"] and built["compiles"] == 1
    loaded = _result(_spawn("ext", ["tiny", src], _env(tmp_path / "machine-b", server, key_file,
                                                        OPSMITH_MUST_HIT=1)))
    assert not loaded["built"] and loaded["code"] == built["code"]


# -- bundles for air-gapped machines ------------------------------------------------------------
@nvrtc_needed
def test_export_import_on_a_fresh_cache_compiles_nothing(tmp_path, key_file, monkeypatch):
    from opsmith.cli import main
    srcs = [_kernel("ship1"), _kernel("ship2")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSMITH_")}
    env.update(OPSMITH_REMOTE_KEY_FILE=os.fspath(key_file), OPSMITH_LOG_LEVEL="WARNING")
    built = _result(_spawn("nvrtc", srcs, env | {"OPSMITH_CACHE_DIR": os.fspath(tmp_path / "ci")}))
    assert built["compiles"] == 2
    bundle = tmp_path / "kernels.opsmith"
    monkeypatch.setenv("OPSMITH_REMOTE_KEY_FILE", os.fspath(key_file))
    assert main(["--cache-dir", os.fspath(tmp_path / "ci"), "cache", "export", os.fspath(bundle),
                 "--kind", "cubin"]) == 0
    assert main(["--cache-dir", os.fspath(tmp_path / "node"), "cache", "import", os.fspath(bundle)]) == 0
    loaded = _result(_spawn("nvrtc", srcs, env | {"OPSMITH_CACHE_DIR": os.fspath(tmp_path / "node"),
                                                  "OPSMITH_MUST_HIT": "1"}))
    assert loaded["compiles"] == 0 and loaded["codes"] == built["codes"]
    # a bundle signed with another key is refused on import, and nothing is installed
    other = tmp_path / "other.key"
    other.write_bytes(b"y" * 32)
    other.chmod(0o600)
    monkeypatch.setenv("OPSMITH_REMOTE_KEY_FILE", os.fspath(other))
    assert main(["--cache-dir", os.fspath(tmp_path / "node2"), "cache", "import", os.fspath(bundle)]) == 1
    from opsmith._cache._local import LocalStore
    assert list(LocalStore(tmp_path / "node2").list()) == []
