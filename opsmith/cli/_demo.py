"""``opsmith demo``: build the tutorial's ReLU op, check it against torch, time cold and warm loads.

The CPU part always runs. The CUDA part runs where a GPU is present (NVRTC kernel path);
without one the demo says so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

__all__ = ["run_demo", "RELU_CPP"]

# The tutorial's ReLU (002), for CPU tensors: the same op its CUDA kernel computes.
RELU_CPP = r'''
torch::Tensor relu(torch::Tensor x) {
  TORCH_CHECK(x.device().is_cpu(), "relu: expected a CPU tensor");
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "relu: expected float32");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t n = xc.numel();
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] > 0.f ? xp[i] : 0.f;
  return y;
}
'''

_CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import opsmith
from opsmith.cli._demo import RELU_CPP
if sys.argv[1] == "cold":
    art = opsmith.build_inline("opsmith_demo_relu", RELU_CPP, functions=["relu"])
    m = opsmith.load_artifact(art)
    built = art.built
else:  # what a user's later runs call: load_inline (answered by the warm index)
    m = opsmith.load_inline("opsmith_demo_relu", RELU_CPP, functions=["relu"])
    built = None  # load_inline does not say; "full_lookup" tells whether the warm index answered
t2 = time.perf_counter()
if sys.argv[1] == "cold":
    # As a user's first run calls it: load_inline records this call in the warm index, so
    # that later runs (the warm phase) are answered by stat stamps alone.
    m = opsmith.load_inline("opsmith_demo_relu", RELU_CPP, functions=["relu"])
x = torch.randn(1 << 20)
ok = bool(torch.equal(m.relu(x), torch.relu(x)))
print(json.dumps({"load_s": t2 - t1, "built": built, "ok": ok, "full_lookup": "opsmith._build._engine" in sys.modules}))
'''


def _child(env, phase: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, phase], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"opsmith demo: the build failed (exit {out.returncode}); see above")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _bytecode_present() -> bool:
    import importlib.util

    from opsmith._torch import _extension
    try:
        return os.path.exists(importlib.util.cache_from_source(_extension.__file__))
    except (NotImplementedError, ValueError):
        return False


def run_demo(fresh: bool = False) -> int:
    """Run the demo; returns a process exit code."""
    env = dict(os.environ)
    if fresh:
        # A temporary cache, removed at the end. No precompiled headers for it: their
        # background build would outlive the demo and leave ~170 MB (clang) behind.
        tmp = tempfile.mkdtemp(prefix="opsmith-demo-")
        env.update(OPSMITH_CACHE_DIR=tmp, OPSMITH_PCH="0")
        try:
            return _run_demo(env, fresh=True)
        finally:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    return _run_demo(env, fresh=False)


def _run_demo(env: dict, fresh: bool) -> int:
    from opsmith._config import settings
    cache = env.get("OPSMITH_CACHE_DIR") or os.fspath(settings.cache_path)
    print(f"opsmith demo: the tutorial's ReLU as a torch op (cache: {cache}"
          + (", temporary: removed at the end, without precompiled headers)" if fresh else ")"))
    t = time.perf_counter()
    cold = _child(env, "cold")
    cold_wall = time.perf_counter() - t
    warm = _child(env, "warm")
    what = "built" if cold["built"] else "found in the cache"
    first = ("; a first build on a machine goes without precompiled torch headers and starts "
             "building them in the background") if cold["built"] and not fresh and settings.pch else ""
    print(f"  CPU relu: {what} in {cold['load_s']:.2f} s (process {cold_wall:.1f} s{first})")
    note = ""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not _bytecode_present():
        note = ("; PYTHONDONTWRITEBYTECODE is set and opsmith has no .pyc files, so Python compiles "
                "its modules from source at every import: unset it once, or run "
                "`python -m compileall` on the package, for the real figure")
    print(f"  CPU relu: warm load in a fresh process {warm['load_s'] * 1e3:.1f} ms (after import torch{note})")
    print(f"  CPU relu: matches torch.relu on 1M random floats: {'yes' if cold['ok'] and warm['ok'] else 'NO'}")
    ok = cold["ok"] and warm["ok"]
    ok = _cuda_part(env) and ok
    return 0 if ok else 1


def _cuda_part(env) -> bool:
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        print("  CUDA relu: skipped, no CUDA GPU on this machine (the CPU part ran)")
        return True
    # The CUDA context is created (by torch) before the clock starts: it costs ~0.1-0.3 s in
    # any tool and is not opsmith's work.
    code = r'''
import json, time
import torch
x = torch.randn(1 << 24, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
import opsmith
from opsmith.cli._demo_cuda import relu_module
relu = relu_module()
y = relu(x)
torch.cuda.synchronize()
t1 = time.perf_counter()
print(json.dumps({"s": t1 - t0, "ok": bool(torch.equal(y, torch.relu(x)))}))
'''
    res = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print("  CUDA relu: FAILED\n" + out.stderr[-3000:])
            return False
        res.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"  CUDA relu (NVRTC): source to first finished launch {res[0]['s'] * 1e3:.0f} ms, "
          f"warm (cached cubin) {res[1]['s'] * 1e3:.1f} ms, both after torch created the CUDA context; "
          f"matches torch.relu: {'yes' if res[0]['ok'] else 'NO'}")
    return res[0]["ok"] and res[1]["ok"]
