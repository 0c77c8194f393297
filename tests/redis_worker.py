"""A "process on a machine" for tests/cache/test_redis_cache.py and bench/bench_redis.py.

Run as ``python tests/redis_worker.py MODE ARG...`` with the machine's OPSMITH_* variables
set; prints one JSON line with what it did (NVRTC compiles, the code's sha256, seconds).

Modes:
  nvrtc SRC...        compile each CUDA source (sm_90) with NVRTC, or load it from the cache
  hang SRC            take the build lease for SRC, then hang inside the compile (to be killed)
  ext NAME SRC        build_inline a small C++ library (no torch headers), or load it
"""
from __future__ import annotations

import hashlib
import json
import sys
import time


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    mode, args = argv[0], argv[1:]
    out: dict = {"mode": mode}
    if mode in ("nvrtc", "hang"):
        from opsmith._build import _nvrtc
        if mode == "hang":
            def hang(*a, **k):
                print(json.dumps({"holding": True}), flush=True)
                time.sleep(3600)
            _nvrtc._compile = hang
        codes = []
        for src in args:
            b = _nvrtc.compile_cuda(src, arch="sm_90")
            codes.append(hashlib.sha256(b.code).hexdigest())
        out.update(compiles=_nvrtc.nvrtc_stats["compiles"], codes=codes)
    elif mode == "ext":
        import opsmith
        art = opsmith.build_inline(args[0], args[1], is_python_module=False, no_implicit_headers=True)
        out.update(compiles=art.compiled_units, built=bool(art.built),
                   code=hashlib.sha256(art.path.read_bytes()).hexdigest())
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    out["seconds"] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
