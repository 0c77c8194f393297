"""Run in a fresh process where an opsmith package is installed: import it and check that its
ops work with zero compiles. Prints one JSON line. Used by tests/package (CPU, fresh venvs) and
by scripts/gpu_check.sh (CUDA).

    python installed_check.py PACKAGE [--cuda] [--block-nvrtc]

--block-nvrtc makes cuda.bindings.nvrtc unimportable first (a machine without NVRTC).
"""
from __future__ import annotations

import gc
import importlib.abc
import json
import sys
import time


class _NoNvrtc(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cuda.bindings.nvrtc" or name.startswith("nvidia.cuda_nvrtc"):
            raise ImportError(f"{name} is blocked: this process plays a machine without NVRTC")


def main() -> int:
    pkg = sys.argv[1]
    if "--block-nvrtc" in sys.argv:
        sys.meta_path.insert(0, _NoNvrtc())
    import torch
    gc_ms = [0.0]
    gc_t = [0.0]

    def _gc(phase, info):  # the cyclic collector's pauses inside the import (they vary by process)
        if phase == "start":
            gc_t[0] = time.perf_counter()
        else:
            gc_ms[0] += (time.perf_counter() - gc_t[0]) * 1e3
    gc.callbacks.append(_gc)
    t0 = time.perf_counter()
    mod = __import__(pkg)
    import_ms = (time.perf_counter() - t0) * 1e3
    gc.callbacks.remove(_gc)
    from opsmith._build import _nvrtc, _prebuilt
    out = {"torch": torch.__version__, "import_ms": import_ms, "import_gc_ms": gc_ms[0], "ops": {}}
    ns = getattr(torch.ops, pkg)
    for name in ("relu", "relu_backward"):
        out["ops"][f"{pkg}::{name}"] = str(getattr(ns, name).default._schema).split("::", 1)[1]
    x = torch.randn(1000, dtype=torch.float32, requires_grad=True)
    y = ns.relu(x)
    y.square().sum().backward()
    out["cpu_ok"] = bool(torch.equal(y, x.clamp_min(0)) and torch.equal(x.grad, 2 * x.clamp_min(0) * (x > 0)))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        f = ns.relu(torch.empty(3, 5))
    out["fake_ok"] = list(f.shape) == [3, 5]
    if hasattr(torch.library, "opcheck"):
        torch.library.opcheck(ns.relu.default, (torch.randn(64),))
        out["opcheck"] = "passed"
    if "--cuda" in sys.argv:
        xc = torch.randn(1 << 20, device="cuda", requires_grad=True)
        yc = ns.relu(xc)
        yc.square().sum().backward()
        torch.cuda.synchronize()
        out["cuda_equal"] = bool(torch.equal(yc, xc.clamp_min(0)))
        out["cuda_grad_equal"] = bool(torch.equal(xc.grad, 2 * xc.clamp_min(0) * (xc > 0)))
        out["cuda_ops_equal"] = _ops_equal(torch)
        if "--save" in sys.argv:  # the outputs, for a bitwise comparison with the JIT path
            torch.save(_outputs(torch, ns), sys.argv[sys.argv.index("--save") + 1])
    out["nvrtc"] = dict(_nvrtc.nvrtc_stats)
    out["prebuilt"] = dict(_prebuilt.prebuilt_stats)
    out["packages"] = [p.name for p in _prebuilt.packages()]
    out["module"] = mod.__file__
    print(json.dumps(out))
    return 0


def _outputs(torch, ns, ops: bool | None = None) -> dict:
    """Outputs of the package's relu and of opsmith.ops on fixed CUDA inputs (seeded)."""
    import opsmith.ops as O
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(257, 1031, device="cuda", generator=g)
    w = torch.randn(1031, device="cuda", generator=g)
    out = {"relupkg": ns.relu(x)}
    if ops is None:  # with opsmith.ops where its kernels are packaged (the JIT side passes ops=True)
        try:
            __import__("opsmith_ops_kernels")
            ops = True
        except ImportError:
            ops = False
    if not ops:
        return {k: v.cpu() for k, v in out.items()}
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        xd, wd = x.to(dt), w.to(dt)
        out.update({f"relu_{dt}": O.relu(xd), f"gelu_{dt}": O.gelu(xd), f"silu_{dt}": O.silu(xd),
                    f"softmax_{dt}": O.softmax(xd), f"rms_norm_{dt}": O.rms_norm(xd, [1031], wd),
                    f"layer_norm_{dt}": O.layer_norm(xd, [1031], wd, wd)})
    return {k: v.cpu() for k, v in out.items()}


def _ops_equal(torch) -> dict:
    """opsmith.ops on CUDA (its kernels from the opsmith-ops-kernels wheel, if installed)."""
    try:
        __import__("opsmith_ops_kernels")
    except ImportError:
        return {}
    import torch.nn.functional as F

    import opsmith.ops as O
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    return {"relu": bool(torch.equal(O.relu(x), torch.relu(x))),
            "rms_norm": bool(torch.allclose(O.rms_norm(x, [1024], w).float(), F.rms_norm(x, [1024], w).float(),
                                            atol=3e-2, rtol=3e-2)),
            "softmax": bool(torch.allclose(O.softmax(x.float()), torch.softmax(x.float(), -1), atol=1e-6))}


if __name__ == "__main__":
    sys.exit(main())
