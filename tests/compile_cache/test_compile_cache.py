"""opsmith.compile_cache: torch.compile's artifacts through opsmith's signed, leased cache.

Every "process" is a real process (tests/compile_cache/compile_cache_worker.py), so that inductor's
in-memory caches cannot answer, with its own opsmith cache directory and its own
TORCHINDUCTOR_CACHE_DIR (inductor's local cache cannot answer either), enabled as a launcher
would: OPSMITH_COMPILE_CACHE=1, no code change. The shared tier is a real redis-server on a
loopback port. Compiles are counted with torch's own counters (fxgraph_cache_miss: one per
graph inductor compiled) and opsmith's C++ kernel counter.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")
try:
    import redis  # noqa: F401
    _REDIS_PY = None
except ImportError as exc:
    _REDIS_PY = f"the redis package is not installed ({exc}); pip install 'opsmith[test]'"
needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None or _REDIS_PY is not None,
    reason=_REDIS_PY or "redis-server is not installed (scripts/setup.sh --test installs it with apt-get)")

WORKER = os.fspath(Path(__file__).with_name("compile_cache_worker.py"))
GRAPHS = 2  # the model's forward and backward graphs


def _env(tmp: Path, name: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPSMITH_", "TORCHINDUCTOR_"))}
    env.update(OPSMITH_COMPILE_CACHE="1", OPSMITH_CACHE_DIR=os.fspath(tmp / f"{name}-opsmith"),
               TORCHINDUCTOR_CACHE_DIR=os.fspath(tmp / f"{name}-inductor"),
               # no ISA probe compiles (machine facts, not graphs) and no compile worker pool:
               # faster on 2 cores, and every C++ compile runs in the process that counts it
               TORCHINDUCTOR_VEC_ISA_OK="1", TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def _start(tmp: Path, name: str, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, *args], env=_env(tmp, name, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, check: bool = True) -> tuple[dict | None, str]:
    out, err = proc.communicate(timeout=300)
    if check:
        assert proc.returncode == 0, err[-4000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    r = json.loads(lines[-1]) if lines else None
    assert r is None or r["enabled"], (
        "OPSMITH_COMPILE_CACHE=1 did not enable the compile cache: is opsmith's `torch.backends` entry "
        "point installed? Run `pip install -e .` (scripts/setup.sh does).")
    return r, err


def _run(tmp: Path, name: str, *args: str, check: bool = True, **extra: str) -> tuple[dict | None, str]:
    return _finish(_start(tmp, name, *args, **extra), check)


def _misses(r: dict) -> int:
    return r["inductor"].get("fxgraph_cache_miss", 0)


def _cpp(r: dict, what: str) -> int:
    return int(r["opsmith"].get("cpp-kernel", {}).get(what, 0))


def _same_outputs(a: dict, b: dict) -> None:
    assert a["y"] == b["y"] and a["grad"] == b["grad"]


class _Redis:
    def __init__(self, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", os.fspath(tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        self.client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A redis-server, a signing key, and process A's run that compiled and published."""
    if REDIS_SERVER is None or _REDIS_PY is not None:
        pytest.skip(_REDIS_PY or "redis-server is not installed")
    tmp = tmp_path_factory.mktemp("compile-cache")
    server = _Redis(tmp)
    key = tmp / "cluster.key"
    key.write_text("a-shared-secret-of-the-test-cluster\n")
    key.chmod(0o600)
    remote = {"OPSMITH_REMOTE_CACHE": server.url, "OPSMITH_REMOTE_KEY_FILE": os.fspath(key)}
    a, _ = _run(tmp, "A", OPSMITH_REMOTE_PREFIX="pub", **remote)
    yield {"tmp": tmp, "server": server, "remote": remote, "a": a}
    server.proc.kill()
    server.proc.wait()


# -- torch's private names ------------------------------------------------------------------------
def test_the_private_torch_names_it_relies_on_are_as_expected(monkeypatch):
    """Fails loudly (naming each one) when a torch release moves or reshapes a hook."""
    from opsmith.compile_cache import _torch_private as tp
    assert tp.problems() == []
    assert tp.probe_hook_problems() == []
    from torch._inductor import codecache
    monkeypatch.setattr(codecache, "_worker_compile_cpp", lambda lock_path: None)
    assert any("_worker_compile_cpp" in p for p in tp.problems())


def test_enable_refuses_a_torch_without_the_hooks(monkeypatch):
    from torch._inductor import compile_fx

    import opsmith.compile_cache as cc
    from opsmith._errors import ConfigError
    monkeypatch.delattr(compile_fx, "fx_codegen_and_compile")
    with pytest.raises(ConfigError, match="fx_codegen_and_compile"):
        cc.enable()
    assert not cc.is_enabled()


def test_a_compile_worker_process_gets_opsmiths_backends_not_torchs_redis(tmp_path):
    """A process that imports inductor's cache classes without compiling (inductor's compile
    workers read autotuning results there) has them pointed at opsmith, never at torch's own
    Redis backend."""
    code = ("import sys, torch, torch._inductor.remote_cache as rc\n"
            "print([getattr(getattr(rc, c).backend_override_cls, '__name__', None) for c in "
            "('RemoteFxGraphCache', 'RemoteAOTAutogradCache', 'RemoteAutotuneCache')], "
            "'torch._inductor.compile_fx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, "wrk"), capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['OpsmithBackend', 'OpsmithBackend', 'OpsmithBackend'] False"


def test_the_environment_variable_imports_nothing_until_the_first_compile(tmp_path):
    code = ("import sys, torch\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch._inductor', 'opsmith.compile_cache'))))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, "imp"), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['opsmith.compile_cache', 'opsmith.compile_cache._autoload']", (
        "expected opsmith's autoload hook and nothing of inductor (is opsmith's `torch.backends` entry "
        "point installed? `pip install -e .`)")


# -- one process publishes, another loads ---------------------------------------------------------
def test_process_a_compiles_and_publishes(shared):
    a = shared["a"]
    assert a["enabled"]
    assert _misses(a) == GRAPHS
    assert a["opsmith"]["fx-graph"]["puts"] == GRAPHS
    assert a["opsmith"]["aot-autograd"]["puts"] == 1
    assert _cpp(a, "compiles") >= 1 and _cpp(a, "puts") == _cpp(a, "compiles")
    stats = subprocess.run([sys.executable, "-m", "opsmith", "--cache-dir", os.fspath(shared["tmp"] / "A-opsmith"),
                            "cache", "stats"], capture_output=True, text=True, timeout=60)
    assert stats.returncode == 0, stats.stderr
    assert "compile:" in stats.stdout and "fx-graph" in stats.stdout and "cpp-kernel" in stats.stdout


def test_a_new_node_runs_zero_compiles_and_gets_equal_outputs(shared, tmp_path):
    b, _ = _run(tmp_path, "B", OPSMITH_REMOTE_PREFIX="pub", **shared["remote"])
    assert _misses(b) == 0
    assert b["inductor"]["fxgraph_cache_hit"] == GRAPHS
    assert b["aot_autograd"]["autograd_cache_hit"] == 1
    assert _cpp(b, "compiles") == 0 and _cpp(b, "hits") == _cpp(shared["a"], "puts")
    _same_outputs(shared["a"], b)


def test_a_tampered_entry_is_refused_with_a_warning_and_recompiled(shared, tmp_path):
    """An attacker who can write to Redis rewrites every entry (new bytes, sha256 fixed up,
    signed with their own key): each is refused, and B compiles it itself."""
    from opsmith._cache._bundle import Signer, pack, unpack
    client = shared["server"].client
    attacker = Signer(b"not-the-cluster-key-0123456789")
    copied = 0
    for name in client.scan_iter(match="pub:*:entry"):
        b = unpack(client.get(name), None, signer=None, trust_unsigned=True)
        files = {n: (d[:-1] + bytes([d[-1] ^ 1]) if n in ("data", "binary") else d) for n, d in b.files.items()}
        manifest = dict(b.manifest, files={n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                                           for n, d in files.items()})
        client.set(name.decode().replace("pub:", "tam:", 1), pack(b.key, manifest, files, attacker))
        copied += 1
    assert copied >= 3
    b, err = _run(tmp_path, "B", OPSMITH_REMOTE_PREFIX="tam", **shared["remote"])
    assert "refused the shared cache's entry" in err and "signed with another key" in err
    assert _misses(b) == GRAPHS and b["opsmith"]["fx-graph"]["hits"] == 0
    _same_outputs(shared["a"], b)


def test_redis_down_compiles_locally(shared, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    remote = dict(shared["remote"], OPSMITH_REMOTE_CACHE=f"redis://127.0.0.1:{closed}/0")
    b, err = _run(tmp_path, "B", **remote)
    assert "did not answer" in err
    assert _misses(b) == GRAPHS
    _same_outputs(shared["a"], b)


def test_a_changed_model_or_inductor_config_is_a_miss(shared, tmp_path):
    wider, _ = _run(tmp_path, "W", "--width", "48", OPSMITH_REMOTE_PREFIX="pub", **shared["remote"])
    assert _misses(wider) == GRAPHS
    config, _ = _run(tmp_path, "C", "--config", "fallback_random=true", OPSMITH_REMOTE_PREFIX="pub",
                     **shared["remote"])
    assert _misses(config) == GRAPHS


@pytest.mark.slow  # ~45 s on 2 cores (eight processes importing torch); still in the default run
def test_processes_at_once_on_a_cold_cluster_compile_each_graph_once(shared, tmp_path):
    """Eight "nodes" (own caches) start together on an empty shared cache: the lease makes
    one compile each graph while the others wait for its entry, whatever the timing."""
    go = tmp_path / "go"
    procs = [_start(tmp_path, f"N{i}", "--start-file", os.fspath(go), OPSMITH_REMOTE_PREFIX="herd",
                    **shared["remote"]) for i in range(8)]
    go.touch()
    results = [_finish(p)[0] for p in procs]
    assert sum(_misses(r) for r in results) == GRAPHS
    assert sum(_cpp(r, "compiles") for r in results) == _cpp(shared["a"], "compiles")
    for r in results:
        _same_outputs(shared["a"], r)


def test_a_new_machine_takes_inductors_isa_probe_libraries_from_the_cache(tmp_path):
    """inductor compiles a small library per vector ISA to probe the CPU (seconds); a machine
    with an empty inductor cache takes them from opsmith's and only loads them (the probe)."""
    a, _ = _run(tmp_path, "P", "--probe-only", TORCHINDUCTOR_VEC_ISA_OK="", TMPDIR=_fresh(tmp_path / "tmp-a"))
    probes = a["opsmith"].get("isa-probe", {})
    if not probes.get("misses"):
        pytest.skip(f"inductor probed no vector ISA on this CPU ({a['isa']})")
    assert probes["compiles"] == probes["puts"] >= 1
    b, _ = _run(tmp_path, "Q", "--probe-only", TORCHINDUCTOR_VEC_ISA_OK="", TMPDIR=_fresh(tmp_path / "tmp-b"),
                OPSMITH_CACHE_DIR=os.fspath(tmp_path / "P-opsmith"))
    assert b["isa"] == a["isa"]
    assert b["opsmith"]["isa-probe"]["compiles"] == 0 and b["opsmith"]["isa-probe"]["hits"] == probes["puts"]


def _fresh(path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    return os.fspath(path)


# -- must-hit and bundles -------------------------------------------------------------------------
def test_must_hit_turns_a_miss_into_an_error_naming_the_graph(tmp_path):
    r, err = _run(tmp_path, "M", check=False, OPSMITH_MUST_HIT="1")
    assert r is None
    assert "must-hit mode (OPSMITH_MUST_HIT=1)" in err
    assert "torch.compile would compile the FX graph pt2:fx-graph-v1::" in err


def test_an_exported_bundle_serves_an_air_gapped_node_in_must_hit_mode(shared, tmp_path):
    bundle = tmp_path / "compile.bundle"
    env = dict(os.environ, OPSMITH_REMOTE_KEY_FILE=shared["remote"]["OPSMITH_REMOTE_KEY_FILE"])
    for args in (["--cache-dir", os.fspath(shared["tmp"] / "A-opsmith"), "cache", "export", os.fspath(bundle),
                  "--kind", "torch-compile"],
                 ["--cache-dir", os.fspath(tmp_path / "G-opsmith"), "cache", "import", os.fspath(bundle)]):
        out = subprocess.run([sys.executable, "-m", "opsmith", *args], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
    g, _ = _run(tmp_path, "G", OPSMITH_MUST_HIT="1", OPSMITH_REMOTE_KEY_FILE=env["OPSMITH_REMOTE_KEY_FILE"])
    assert _misses(g) == 0 and _cpp(g, "compiles") == 0
    _same_outputs(shared["a"], g)
