#!/usr/bin/env python3
"""The Triton configs torch.compile(dynamic=False) chooses for the norm forwards: each shape compiled and called once
into a fresh inductor cache, then the ``.best_config`` files that call wrote read back (XBLOCK, R0_BLOCK, num_warps,
num_stages). Needs a GPU; run with an empty TORCHINDUCTOR_CACHE_DIR so that nothing comes from an earlier run:

    rm -rf /tmp/ind; TORCHINDUCTOR_CACHE_DIR=/tmp/ind python3 bench/inductor_best_configs.py
"""
import glob
import json
import os

import torch
import torch.nn.functional as F

SHAPES = (("rms", torch.float32, 65536, 8192), ("ln", torch.float32, 65536, 8192),
          ("rms", torch.float32, 4096, 16384), ("ln", torch.float32, 4096, 16384),
          ("rms", torch.float32, 4096, 24576), ("rms", torch.float32, 2048, 32768), ("ln", torch.float32, 2048, 32768),
          ("rms", torch.bfloat16, 32768, 8192), ("rms", torch.bfloat16, 4096, 16384),
          ("ln", torch.bfloat16, 16384, 16384), ("rms", torch.float32, 2048, 2048), ("ln", torch.float32, 2048, 2048),
          ("rms", torch.float32, 4096, 4096), ("ln", torch.float32, 4096, 4096))


def main():
    cache = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/ind")
    pattern = f"{cache}/**/*.best_config"
    for op, dt, r, c in SHAPES:
        x = torch.randn(r, c, device="cuda", dtype=dt)
        w, b = torch.randn(c, device="cuda", dtype=dt), torch.randn(c, device="cuda", dtype=dt)
        torch._dynamo.reset()
        before = set(glob.glob(pattern, recursive=True))
        f = (lambda: F.rms_norm(x, (c,), w, 1e-6)) if op == "rms" else (lambda: F.layer_norm(x, (c,), w, b, 1e-5))
        torch.compile(f, dynamic=False)()
        torch.cuda.synchronize()
        for p in sorted(set(glob.glob(pattern, recursive=True)) - before):
            cfg = json.load(open(p))
            keys = ("XBLOCK", "R0_BLOCK", "num_warps", "num_stages")
            print(op, dt, f"{r}x{c}", {k: cfg[k] for k in keys if k in cfg}, flush=True)


if __name__ == "__main__":
    main()
