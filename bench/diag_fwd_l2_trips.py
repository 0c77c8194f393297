#!/usr/bin/env python3
"""norm_l2.cu's two-pass forwards (B = 2: two blocks of 1,024 threads' registers an SM, 2 chunks a trip) on rows of
16-64 KiB against the same kernels at 4 chunks a trip (the whole row of 512 threads in one trip at 32 KiB, as
torch.compile's Triton kernel for fp32 65536x8192: XBLOCK 1, R0_BLOCK 8192, 16 warps, two passes, evict_last then
evict_first; it read 4,323 GB/s where ours read 4,043), with the register budget of B = 2, 3 or 4 blocks of 512
threads an SM (``OPSMITH_L2_THREADS`` 512: __launch_bounds__(512, B)), beside the shipped plan (since this script's
first run, the kernels of B = 3 on the rows past 16 up to 32 KiB: t512u4b3's), the kernels of B = 2 at the plan's
threads (b2: the plan before) and torch.compile(dynamic=False); kernels alone (torch.profiler, us a call) as GB/s of
the bytes-moved floor beside a copy of the same bytes, each output checked against the shipped one. Needs a GPU.

With ``--long``: the shipped kernels of B = 1, 2 and 3 at several block sizes (b{B}_{threads}) on rows of 20-128 KiB,
where the plans give B = 2 (1,024 threads; 512 past 16 up to 32 KiB) or B = 1 (past 96 KiB), and float
layer_norm's rows of 20-24 KiB (compile's 16384x6144 read 4,250 GB/s where ours read 3,872-3,904).

    python3 bench/diag_fwd_l2_trips.py [--out FILE.json] [--no-compile] [--long]
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from diag_norm_split import per_kernel  # noqa: E402  (bench/, this script's folder)
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _launch, _launch_norm, _norms, _sources  # noqa: E402

SHAPES = [(torch.float32, r, c) for r, c in ((8192, 8192), (32768, 8192), (65536, 8192), (16384, 4096), (16384, 6144),
                                              (4096, 16384), (8192, 16384))]
SHAPES += [(torch.bfloat16, r, c) for r, c in ((32768, 8192), (4096, 16384), (16384, 16384), (16384, 12288),
                                               (4096, 32768))]
LONG_SHAPES = [(torch.float32, r, c) for r, c in ((16384, 5120), (16384, 6144), (4096, 16384), (8192, 16384),
                                                   (4096, 24576), (2048, 32768), (4096, 32768))]
LONG_SHAPES += [(torch.bfloat16, r, c) for r, c in ((8192, 32768), (2048, 65536))]
LAUNCHES = ((1, 1024), (2, 1024), (2, 512), (2, 256), (3, 512), (3, 256))  # (B, threads) of --long
# variant -> (defines, B): norm_l2.cu compiled under the defines, its kernels of B blocks an SM
VARIANTS = {"b2": ({}, 2), "u4": ({"OPSMITH_L2_UNROLL": 4}, 2)}
VARIANTS.update({f"t512u{u}b{b}": ({"OPSMITH_L2_UNROLL": u, "OPSMITH_L2_THREADS": 512}, b)
                 for u in (2, 4) for b in (2, 3, 4) if (u, b) != (2, 4)})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--long", action="store_true")
    args = ap.parse_args()
    arch = _driver.device_arch(0)
    props = _launch.device_props(0)
    src = _sources.KERNEL_DIR / "norm_l2.cu"
    mods, records = {}, []
    for dt, rows, cols in LONG_SHAPES if args.long else SHAPES:
        dts = str(dt)[6:]
        t, a = _sources.DTYPES[dts]
        if dts not in mods and not args.long:
            mods[dts] = {}
            for v, (defines, b) in VARIANTS.items():
                names = [f"{op}_fwd_l2<{b}, {t}, {a}>" for op in ("layer_norm", "rms_norm")]
                mods[dts][v] = CudaModule(src, name_expressions=names, arch=arch, name=f"diag-l2trips-{v}-{dts}",
                                          include_paths=[_sources.KERNEL_DIR], defines=defines,
                                          options=["--ptxas-options=-v"])
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        gb = 2 * rows * cols * x.element_size() / 1e3
        out = torch.empty_like(x)
        copy = gb / sum(per_kernel(lambda: out.copy_(x)).values())
        y = torch.empty_like(x)
        st, st2 = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
        torch._dynamo.reset()
        for op, arrays in (("layer_norm", 2), ("rms_norm", 1)):
            plan = _launch_norm.norm_l2_plan(rows, cols, x.element_size(), props, arrays)
            threads = plan.block[0]
            cfg = _launch.launch_config(_launch.Plan("l2", (rows,), (threads, 1), 0, 0))
            if op == "layer_norm":
                ours = lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0]  # noqa: E731
                comp = torch.compile(lambda: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False)

                def mk(k, c=cfg):
                    return lambda: (k.launch(c, x, w, b, y, st, st2, rows, cols, 1e-5, 1, 1), y)[1]
            else:
                ours = lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0]  # noqa: E731
                comp = torch.compile(lambda: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)

                def mk(k, c=cfg):
                    return lambda: (k.launch(c, x, w, y, st, rows, cols, 1e-6, 1), y)[1]
            variants = {"shipped": ours}
            for v, (defines, bb) in () if args.long else VARIANTS.items():
                if threads <= defines.get("OPSMITH_L2_THREADS", 1024):
                    variants[v] = mk(mods[dts][v].get_kernel(f"{op}_fwd_l2<{bb}, {t}, {a}>"))
            for bb, th in LAUNCHES if args.long else ():  # the shipped kernels at other launches
                if th * (16 // x.element_size()) * 8 >= cols:  # up to 8 chunks a thread a pass
                    k = _sources.kernel("norm_l2.cu", f"{op}_fwd_l2<{bb}, {{T}}, {{A}}>", dts, 0)
                    c = _launch.launch_config(_launch.Plan("l2", (rows,), (th, 1), 0, 0))
                    variants[f"b{bb}_{th}"] = mk(k, c)
            ref = ours().clone()
            if not args.no_compile:
                variants["compile"] = comp
            rec = {"op": op, "dtype": dts, "rows": rows, "cols": cols, "copy": copy, "threads": threads,
                   "plan_chunks": plan.chunks}
            for v, f in variants.items():
                if v != "compile":
                    got = f()
                    rec[f"{v}_maxdiff"] = float((got.float() - ref.float()).abs().max())
                rec[v] = gb / sum(per_kernel(f).values())
            records.append(rec)
            cells = "  ".join(f"{v} {rec[v]:5.0f}" for v in variants)
            best = max((rec[v], v) for v in variants if v not in ("compile", "shipped"))
            print(f"{op:<11} {dts:<8} {rows:>5}x{cols:<6} t{threads:<4} {cells}  copy {copy:5.0f}  best {best[1]} "
                  f"{best[0] / rec['shipped']:.3f}x shipped", flush=True)
    for dts, ms in mods.items():
        for v, mod in ms.items():
            lines = [ln for ln in mod.binary.log.splitlines() if "registers" in ln or "spill" in ln]
            print(f"-- {dts} {v}\n" + "\n".join(lines[:8]))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "command": " ".join(sys.argv), "records": records}, indent=1))


if __name__ == "__main__":
    main()
