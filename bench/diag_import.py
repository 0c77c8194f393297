#!/usr/bin/env python3
"""Where an installed opsmith package's import spends its time after ``import torch``: each step
of ``CustomOp.register_kernel`` / ``register_fake`` / the C-shim registration timed in a fresh
process (cProfile cannot see calls into C through ctypes or pybind types), then torch's own
registration calls alone for comparison.

    PYTHONPATH=SITE:. python3 bench/diag_import.py relupkg
"""
from __future__ import annotations

import collections
import functools
import json
import sys
import time

T: dict[str, float] = collections.defaultdict(float)


def timed(label, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[label] += (time.perf_counter() - t) * 1e3
    return wrapper


def main() -> int:
    pkg = sys.argv[1]
    t0 = time.perf_counter()
    import torch
    torch_ms = (time.perf_counter() - t0) * 1e3
    import torch.library as tl
    from opsmith._torch import _cshim, _ops
    tl.Library.impl = timed("Library.impl", tl.Library.impl)
    tl.Library.define = timed("Library.define", tl.Library.define)
    tl.Library.__init__ = timed("Library()", tl.Library.__init__)
    tl.register_fake = timed("torch.library.register_fake", tl.register_fake)
    for name in ("register_kernel", "register_fake", "_set_kernels", "_generate", "_register_cshim"):
        if hasattr(_ops.CustomOp, name):
            setattr(_ops.CustomOp, name, timed(f"CustomOp.{name}", getattr(_ops.CustomOp, name)))
    for name in ("register", "library", "why_not"):
        if hasattr(_cshim, name):
            setattr(_cshim, name, timed(f"_cshim.{name}", getattr(_cshim, name)))
    ks = torch._C.DispatchKeySet
    torch._C.DispatchKeySet = timed("DispatchKeySet()", ks)
    t0 = time.perf_counter()
    __import__(pkg)
    total = (time.perf_counter() - t0) * 1e3
    torch._C.DispatchKeySet = ks
    out = {"import_torch_ms": torch_ms, "import_ms": total, "steps_ms": dict(T)}
    # torch's own registration, alone, on a fresh namespace
    steps = {}
    t = time.perf_counter()
    lib = torch.library.Library("opsmith_diag_import", "DEF")
    steps["Library DEF"] = time.perf_counter() - t
    t = time.perf_counter()
    lib.define("f(Tensor x) -> Tensor")
    steps["define"] = time.perf_counter() - t
    for key in ("CPU", "CUDA"):
        t = time.perf_counter()
        lib.impl("f", lambda x: x.clone(), key)
        steps[f"impl {key}"] = time.perf_counter() - t
    t = time.perf_counter()
    torch.library.register_fake("opsmith_diag_import::f", lambda x: torch.empty_like(x), lib=lib)
    steps["register_fake"] = time.perf_counter() - t
    out["torch_alone_ms"] = {k: v * 1e3 for k, v in steps.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
