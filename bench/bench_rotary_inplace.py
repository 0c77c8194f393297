"""Rotary embedding in place (issue 23): ``rotary_embedding_qk(q, k, cos, sin, inplace=True)`` beside the same
rotation out of place and the peers that write q and k themselves, forward, from one run.

    python3 bench/bench_rotary_inplace.py --json FILE [--dtypes bfloat16,float16,float32]

q ``[1, heads, seq, 128]`` and k ``[1, kv_heads, seq, 128]`` (grouped-query attention where kv_heads < heads),
cos/sin ``[seq, 64]`` (transformers' full-width tables ``[1, seq, 128]`` for Liger, which takes those). The peers:
``torch.compile(dynamic=False)`` of transformers' formula written back with ``copy_`` (Inductor writes q and k in
place), and Liger-Kernel's ``liger_rope`` (it rotates contiguous copies of q and k transposed to ``[1, seq, heads,
128]`` in place; where Liger is not importable, the column is left out). GB/s of the floor: q and k read and written
once, the tables read once. Each case's line prints ours in place, ours out of place, the peers and in-place over
the best peer. Last, the host time of one call on a decode step's q and k (``[1, 32, 1, 128]``, ``[1, 8, 1, 128]``):
in place against out of place, microseconds of wall time per call with the GPU not waited for.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import opsmith.ops as ops

SHAPES = [(32, 8, 4096), (32, 32, 4096), (32, 8, 16384), (32, 32, 16384), (64, 8, 32768), (8, 8, 65536)]


def _formula(t, c, s):  # transformers' apply_rotary_pos_emb on one tensor, full-width tables
    return t * c + torch.cat([-t[..., 64:], t[..., :64]], -1) * s


def _compiled():
    def rot(q, k, c, s):
        q.copy_(_formula(q, c, s))
        k.copy_(_formula(k, c, s))
    return torch.compile(rot, dynamic=False)


def _case(heads, kv, seq, dt, liger):
    q = torch.randn(1, heads, seq, 128, device="cuda", dtype=dt)
    k = torch.randn(1, kv, seq, 128, device="cuda", dtype=dt)
    ang = torch.randn(seq, 64, device="cuda")
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    cf, sf = torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]
    nbytes = 2 * (q.nbytes + k.nbytes) + cos.nbytes + sin.nbytes
    torch._dynamo.reset()  # compiled per shape: a fresh cache, no recompile limit met across the cases
    comp = _compiled()
    impls = {"inplace": lambda: ops.rotary_embedding_qk(q, k, cos, sin, inplace=True),
             "out_of_place": lambda: ops.rotary_embedding_qk(q, k, cos, sin),
             "compile": lambda: comp(q, k, cf[:, None], sf[:, None])}
    if liger is not None:
        impls["liger"] = lambda: liger(q, k, cf, sf)
    row = {"heads": heads, "kv_heads": kv, "seq": seq, "dtype": str(dt).split(".")[-1], "bytes": nbytes}
    for name, f in impls.items():
        f()  # compile, first launch
        r = ops.benchmark(f, bytes_moved=nbytes, runs=60, warmup=5)
        row[name] = {"ms": r.median_ms, "gbps": r.gbps}
    peers = [row[n]["gbps"] for n in ("compile", "liger") if n in row]
    row["inplace_vs_best_peer"] = row["inplace"]["gbps"] / max(peers)
    return row


def _host_us(f, calls=2000):
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        ts.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    args = ap.parse_args()
    try:
        from liger_kernel.transformers.functional import liger_rope
    except ImportError:
        liger_rope = None
    rows = []
    print(f"{'dtype':9} {'q heads':>7} {'kv':>3} {'seq':>6}  GB/s: in place / out of place / compile / liger"
          f"   in place vs best peer")
    for dt in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for heads, kv, seq in SHAPES:
            r = _case(heads, kv, seq, dt, liger_rope)
            rows.append(r)
            cols = " / ".join(f"{r[n]['gbps']:.0f}" if n in r else "-"
                              for n in ("inplace", "out_of_place", "compile", "liger"))
            print(f"{r['dtype']:9} {heads:7} {kv:3} {seq:6}  {cols}   {r['inplace_vs_best_peer']:.3f}x", flush=True)
            _write(args, liger_rope, rows, None)  # each case kept, should the run be cut short
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    ang = torch.randn(1, 64, device="cuda")
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    host = {"inplace_us": _host_us(lambda: ops.rotary_embedding_qk(q, k, cos, sin, inplace=True)),
            "out_of_place_us": _host_us(lambda: ops.rotary_embedding_qk(q, k, cos, sin))}
    print(f"host time of one decode-step call (bf16 q [1, 32, 1, 128], k [1, 8, 1, 128]): in place "
          f"{host['inplace_us']:.1f} us, out of place {host['out_of_place_us']:.1f} us")
    _write(args, liger_rope, rows, host)


def _write(args, liger_rope, rows, host) -> None:
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "liger": liger_rope is not None, "command": "python3 bench/bench_rotary_inplace.py " + " ".join(
                f"--{k} {v}" for k, v in vars(args).items())}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "cases": rows, "host": host}, f, indent=1)


if __name__ == "__main__":
    main()
