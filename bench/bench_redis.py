"""Loading through the cluster cache: machine B (cold local cache) loads what machine A built.

Starts a redis-server on a free loopback port (no persistence), then, each in a fresh
process with its own cache directory ("machine"):

  A: builds a small C++ extension library (build_inline, no torch headers) and an NVRTC
     kernel (sm_90) cold: the local build, published to Redis (signed);
  B: a cold local cache: the same two calls, answered by Redis (verified, written locally);
  B': the same, with redis-py already imported (a process that used the remote before);
  B2: a second process on B: a local hit.

Each figure is the wall time of the one call inside its process (imports of opsmith's own
modules included; the process start and `import torch` not: a program that loads a torch
extension has imported torch already, and torch imports asyncio and ssl on the way). B, B'
and B2 run --repeat times (fresh cache directories for B and B'), and the median is shown;
A runs once. opsmith's bytecode is compiled first (`compileall`), as in an installed package.
The compiler runs each call made are counted (target: 0 on B, each call <= 50 ms).

Usage: python bench/bench_redis.py [--json PATH] [--repeat N]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

EXT_SRC = 'extern "C" int bench_add(int a, int b) { return a + b; }\n'
KERNEL_SRC = 'extern "C" __global__ void bench_scale(float* x, float s) { x[threadIdx.x] *= s; }\n'

_CHILD = r"""
import json, sys, time
what, preimport = sys.argv[1], sys.argv[2] == "1"
import torch  # the user's program has torch already; not part of the figure
if preimport:
    import redis
t0 = time.perf_counter()
if what == "ext":
    import opsmith
    art = opsmith.build_inline("bench_ext", sys.argv[3], is_python_module=False, no_implicit_headers=True)
    compiles = art.compiled_units
else:
    from opsmith._build import _nvrtc
    _nvrtc.compile_cuda(sys.argv[3], arch="sm_90")
    compiles = _nvrtc.nvrtc_stats["compiles"]
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "compiles": compiles, "redis_py_imported": "redis" in sys.modules}))
"""


# The part of B's extension call that runs the compiler: its identity for the key.
_PROBE = r"""
import time
from opsmith._toolchain import _cxx
path = _cxx.find_cxx().path  # probes once (not timed): the OS's file cache is warm, as on B
t0 = time.perf_counter()
_cxx._run_probe(path)
print(time.perf_counter() - t0)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(what: str, cache: str, env: dict, preimport: bool = False) -> dict:
    src = EXT_SRC if what == "ext" else KERNEL_SRC
    proc = subprocess.run([sys.executable, "-c", _CHILD, what, "1" if preimport else "0", src],
                          env=env | {"OPSMITH_CACHE_DIR": cache}, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{what} in {cache} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    try:  # the remote tier's own share: GET + signature + sha256 + local write
        with open(os.path.join(cache, "tier-stats.json")) as f:
            remote = json.load(f)["tiers"].get("remote", {})
        out["remote_tier_seconds"] = remote.get("seconds", 0.0)
        out["remote_hits"] = remote.get("hits", 0)
    except (OSError, ValueError, KeyError):
        out["remote_tier_seconds"], out["remote_hits"] = 0.0, 0
    return out


def _median(runs: list[dict]) -> dict:
    """The median run (by seconds), with every run's seconds beside it."""
    ranked = sorted(runs, key=lambda r: r["seconds"])
    med = dict(ranked[(len(ranked) - 1) // 2])
    med["seconds"] = statistics.median(r["seconds"] for r in runs)
    med["compiles"] = sum(r["compiles"] for r in runs)
    med["runs_seconds"] = [r["seconds"] for r in runs]
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each B process (median shown)")
    args = ap.parse_args()
    import compileall

    import opsmith
    compileall.compile_dir(os.path.dirname(opsmith.__file__), quiet=1)
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    tmp = tempfile.mkdtemp(prefix="opsmith-bench-redis-")
    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        key = os.path.join(tmp, "cluster.key")
        with open(key, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        os.chmod(key, 0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPSMITH_")}
        env.update(OPSMITH_REMOTE_CACHE=f"redis://127.0.0.1:{port}/0", OPSMITH_REMOTE_KEY_FILE=key)
        rows = {}
        for what in ("ext", "nvrtc"):
            a = _run(what, os.path.join(tmp, f"a-{what}"), env)
            b = [_run(what, os.path.join(tmp, f"b{i}-{what}"), env) for i in range(args.repeat)]
            b_pre = [_run(what, os.path.join(tmp, f"bp{i}-{what}"), env, preimport=True)
                     for i in range(args.repeat)]
            b_warm = [_run(what, os.path.join(tmp, f"b0-{what}"), env) for _ in range(args.repeat)]
            rows[what] = {"cold_local_build": a, "remote_hit": _median(b),
                          "remote_hit_redis_imported": _median(b_pre), "local_hit_after": _median(b_warm)}
        probe = statistics.median(float(subprocess.run(
            [sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True).stdout)
            for _ in range(args.repeat))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import redis"], check=True)
        t_py = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        redis_import = t_py - (time.perf_counter() - t0)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    names = {"ext": "C++ extension (build_inline)", "nvrtc": "NVRTC kernel (sm_90)"}
    print(f"{'':<30} {'cold local build':>17} {'B via Redis':>12} {'ratio':>7} {'redis-py imported':>18} "
          f"{'then local':>11} {'B compiles':>11} {'tier share':>11}")
    for what, r in rows.items():
        cold, hit, pre, warm = (r[k]["seconds"] for k in ("cold_local_build", "remote_hit",
                                                          "remote_hit_redis_imported", "local_hit_after"))
        comp = r["remote_hit"]["compiles"] + r["remote_hit_redis_imported"]["compiles"]
        print(f"{names[what]:<30} {cold * 1000:>14.1f} ms {hit * 1000:>9.1f} ms {cold / hit:>6.1f}x "
              f"{pre * 1000:>15.1f} ms {warm * 1000:>8.1f} ms {comp:>11} "
              f"{r['remote_hit']['remote_tier_seconds'] * 1000:>8.1f} ms")
    imported = any(r["remote_hit"]["redis_py_imported"] for r in rows.values())
    print(f"(importing redis-py costs {redis_import * 1000:.0f} ms here; the 'B via Redis' processes "
          f"{'imported it' if imported else 'did not import it (reads speak RESP)'}; "
          f"the compiler probe (--version and -dumpmachine, at once) is {probe * 1000:.0f} ms of the "
          f"extension's figure; 'tier share' is the remote tier's part of the call: GET, signature and sha256 checks, "
          f"local write; medians of {args.repeat} runs; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"target: <= 50 ms each, 0 compiles)")
    if args.json:
        doc = {"rows": rows, "redis_py_import_seconds": redis_import, "compiler_probe_seconds": probe, "python": platform.python_version(),
               "machine": platform.machine(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
