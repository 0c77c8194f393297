#!/usr/bin/env python3
"""Issue 23 diagnostic: where the host's time goes in the patched Llama step (the GPU idles
~2.5 ms a step there, bench_llama_step.py --profile). Two parts, on CUDA:

* the host cost of one call of each op ``patch`` puts in a Llama (forward, and forward +
  backward), beside torch's own, on inputs small enough that the GPU never holds the host up:
  microseconds of CPU time a call, the median of ``--reps`` timed loops;
* ``cProfile`` of ``--steps`` training steps of bench_llama_step.py's model (``--model hf``:
  transformers' LlamaForCausalLM), patched, after warm-up: the functions with the most own time.

    python3 bench/diag_host.py --out DIR     # host.json, cprofile.txt
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F

import opsmith.ops as O


def per_call(f, n: int = 300, reps: int = 7) -> float:
    for _ in range(30):
        f()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            f()
        out.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def op_costs() -> dict:
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(8, 256, device=dev, dtype=bf, requires_grad=True)
    q = torch.randn(1, 16, 8, 128, device=dev, dtype=bf).transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    cs = torch.randn(1, 1, 8, 128, device=dev, dtype=bf)
    g = torch.randn(8, 512, device=dev, dtype=bf, requires_grad=True)
    u = torch.randn(8, 512, device=dev, dtype=bf, requires_grad=True)
    logits = torch.randn(8, 1000, device=dev, dtype=bf, requires_grad=True)
    target = torch.randint(0, 1000, (8,), device=dev)
    rms_o, rms_t = O.RMSNorm(256, 1e-6).to(dev, bf), torch.nn.RMSNorm(256, 1e-6).to(dev, bf)

    def rot_t(t):
        h = t.shape[-1] // 2
        return t * cs + torch.cat([-t[..., h:], t[..., :h]], -1) * cs

    cases = {
        "rms_norm module": (lambda: rms_o(x), lambda: rms_t(x)),
        "rotary_embedding": (lambda: O.rotary_embedding(q, cs, cs), lambda: rot_t(q)),
        "silu_mul": (lambda: O.silu_mul(g, u), lambda: F.silu(g) * u),
        "cross_entropy": (lambda: O.cross_entropy(logits, target), lambda: F.cross_entropy(logits.float(), target)),
    }
    res = {}
    for name, (ours, theirs) in cases.items():
        row = {}
        for who, f in (("opsmith", ours), ("torch", theirs)):
            row[who + " fwd"] = per_call(f)
            row[who + " fwd+bwd"] = per_call(lambda f=f: f().float().sum().backward())
        res[name] = row
        print(f"{name:<18} " + "  ".join(f"{k} {v:6.1f}" for k, v in row.items()), flush=True)
    return res


def profile_steps(model_kind: str, steps: int) -> str:
    import bench_llama_step as B
    cfg = dict(vocab=32000, hidden=2048, inter=5632, heads=16, layers=4, seq=1024)
    torch.manual_seed(0)
    model = B.build(model_kind, cfg).to(device="cuda", dtype=torch.bfloat16)
    O.patch(model)
    if model_kind == "hf":
        model = B.HFStep(model)
    tokens = torch.randint(0, cfg["vocab"], (4, cfg["seq"]), device="cuda")
    labels = torch.roll(tokens, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        model(tokens, labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    host = (time.perf_counter() - t) / steps * 1e3
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / steps * 1e3
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    s.write(f"host {host:.2f} ms / step under cProfile (to the last launch), wall {wall:.2f} ms\n")
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(45)
    return s.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", choices=("hf", "plain"), default="hf")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res = op_costs()
    (args.out / "host.json").write_text(json.dumps({"us_per_call": res, "device": torch.cuda.get_device_name(),
                                                    "torch": torch.__version__}, indent=1))
    text = profile_steps(args.model, args.steps)
    (args.out / "cprofile.txt").write_text(text)
    print(text[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
