"""Issue 23: the norm forwards' plans that depend on the device's DRAM bandwidth an SM
(``_launch_norm.low_bandwidth_per_sm``: at most ``LOW_BW_SM_GBPS``, the H100's 25 GB/s, against the H200's 36),
timed on the device at hand under both rules: "low" (the H100's: layer_norm's 16-bit rows of 2-4 KiB at 2 chunks
a thread, ``layer_norm_full2_plan``; the rows of 16 KiB at 4, ``norm_c4_plan``; the rows of 16-32 KiB read once
at 8, ``norm_c8_plan``) and "high" (4 chunks at 2-4 KiB, the L2 rows from 16 KiB, read twice, the second time
from L2). The Python implementations (:mod:`opsmith.ops._norms`) under ``_launch.device_props`` patched to report
a low or an unknown bandwidth, each rule timed with ``opsmith.ops.benchmark`` (L2 flushed) in ``--rounds``
rounds in turn; prints µs and GB/s a rule and writes ``--json``.

    python3 bench/diag_plans_bw.py --json plans.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics


@contextlib.contextmanager
def _rule(launch, props, low: bool):
    """``launch.device_props`` reporting a low DRAM bandwidth an SM (``low``) or none known, inside the block."""
    old = launch.device_props
    fake = props._replace(mem_gbps=1 if low else 0)
    launch.device_props = lambda device: fake
    try:
        yield
    finally:
        launch.device_props = old


def main() -> None:
    import torch

    from opsmith import ops
    from opsmith.ops import _launch, _launch_norm, _norms

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    props = _launch.device_props(0)
    bf, f32 = torch.bfloat16, torch.float32

    def ln(x, w):
        return _norms.layer_norm_fwd(x, (x.shape[-1],), w, w, 1e-5)

    def rms(x, w):
        return _norms.rms_norm_fwd(x, (x.shape[-1],), w, 1e-6)

    cases = [("layer_norm", ln, bf, (r, c)) for c in (1024, 2048) for r in (256, 512, 1024, 2048, 4096, 8192, 65536)]
    cases += [(op, f, dt, s) for op, f in (("layer_norm", ln), ("rms_norm", rms))
              for dt, s in ((bf, (8192, 8192)), (bf, (32768, 8192)), (f32, (16384, 4096)), (bf, (4096, 16384)),
                            (bf, (16384, 16384)), (f32, (4096, 8192)), (f32, (16384, 8192)), (f32, (16384, 6144)))]
    out = {"device": torch.cuda.get_device_name(0), "mem_gbps": props.mem_gbps, "sm_count": props.sm_count,
           "low_bandwidth_per_sm": _launch_norm.low_bandwidth_per_sm(props), "torch": torch.__version__,
           "copy_gbps": ops.copy_bandwidth(), "cases": []}
    print(f"{out['device']}: {props.mem_gbps} GB/s DRAM, {props.sm_count} SMs "
          f"({props.mem_gbps / props.sm_count:.1f} an SM: low {out['low_bandwidth_per_sm']}), "
          f"copy {out['copy_gbps']:.0f} GB/s", flush=True)
    for op, f, dt, (rows, cols) in cases:
        torch.manual_seed(0)
        x = torch.randn(rows, cols, dtype=dt, device="cuda")
        w = torch.randn(cols, dtype=dt, device="cuda")
        nbytes = 2 * x.nbytes  # x read, y written
        with _rule(_launch, props, True):
            want = f(x, w)
        with _rule(_launch, props, False):
            other = f(x, w)
        for a, c in zip(want, other):
            torch.testing.assert_close(a, c, atol=2e-2 if dt == bf else 1e-4, rtol=2e-2 if dt == bf else 1e-4)
        per = {"low": [], "high": []}
        for rnd in range(args.rounds):
            for v in (("low", "high") if rnd % 2 == 0 else ("high", "low")):
                with _rule(_launch, props, v == "low"):
                    per[v].append(ops.benchmark(lambda: f(x, w), runs=args.runs).median_ms * 1e3)
        us = {v: statistics.median(t) for v, t in per.items()}
        row = {"op": op, "dtype": str(dt)[6:], "rows": rows, "cols": cols, "us": us,
               "gbps": {v: nbytes / t / 1e3 for v, t in us.items()}, "rounds_us": per}
        out["cases"].append(row)
        gb = row["gbps"]
        print(f"{op:10s} {row['dtype']:8s} {rows:>6d}x{cols:<6d} low {us['low']:8.2f} us {gb['low']:6.0f} GB/s | "
              f"high {us['high']:8.2f} us {gb['high']:6.0f} GB/s | low / high {us['high'] / us['low']:.3f}x",
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
