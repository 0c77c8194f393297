"""One "process" of tests/compile_cache/test_compile_cache.py: torch.compile a small model, forward and backward.

Enabled the way a launcher would enable it, with OPSMITH_COMPILE_CACHE=1 in the environment
(the test sets it): this script never calls opsmith before the compile. It prints one JSON
line: torch's own counters, opsmith's compile counters, and the outputs and gradients.

Usage: python compile_cache_worker.py [--width N] [--config NAME=VALUE] [--start-file PATH] [--probe-only]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=32, help="hidden width (another width: another graph)")
parser.add_argument("--config", action="append", default=[], help="torch._inductor.config NAME=VALUE (bool/int)")
parser.add_argument("--start-file", help="wait until this file exists before compiling (start N at once)")
parser.add_argument("--probe-only", action="store_true", help="only pick inductor's CPU vector ISA (its probes)")
args = parser.parse_args()

import torch

if args.probe_only:
    import torch._inductor.compile_fx
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    import opsmith.compile_cache as cc
    print(json.dumps({"enabled": cc.is_enabled(), "isa": str(pick_vec_isa()), "opsmith": cc.stats()}), flush=True)
    sys.exit(0)

for item in args.config:
    name, _, value = item.partition("=")
    import torch._inductor.config as inductor_config
    setattr(inductor_config, name, {"true": True, "false": False}.get(value.lower(), value)
            if not value.lstrip("-").isdigit() else int(value))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 8))
x = torch.randn(4, 16)

if args.start_file:
    while not os.path.exists(args.start_file):
        time.sleep(0.02)

t0 = time.perf_counter()
compiled = torch.compile(model)
y = compiled(x)
y.sum().backward()
seconds = time.perf_counter() - t0

from torch._dynamo.utils import counters

import opsmith.compile_cache as cc

print(json.dumps({
    "seconds": seconds,
    "enabled": cc.is_enabled(),
    "inductor": dict(counters["inductor"]),
    "aot_autograd": dict(counters["aot_autograd"]),
    "opsmith": cc.stats(),
    "y": y.detach().flatten().tolist(),
    "grad": model[0].weight.grad.flatten().tolist(),
}), flush=True)
sys.exit(0)
