#!/usr/bin/env python3
"""The row forwards at 4096x4096 and nearby, where Liger-Kernel still leads (bench/results/ops-hints-h100-2026-11-27/
peers-table.txt: layer_norm 0.93x, softmax 0.91x). Nsight Compute on that shape (ncu.txt there): our layer_norm_fwd_c4
holds 80 registers, 6 blocks of 128 threads an SM (37.5 % occupancy) against Liger's 48 registers, 5 blocks of 256
(62.5 %); our softmax_fwd_wide 64 registers, 50 %, against Liger's 32 registers, 100 %. Kernels of the unchecked row
alone (ROW_FULL: no element path compiled in) at 2 and 4 chunks a thread, against the shipped op and Liger, bf16,
GB/s of the bytes-moved floor, L2 flushed (opsmith.ops.benchmark, median of 200), each checked against the op; and
their registers (ptxas). ``ln_full4`` is the op's 4-chunk layer_norm row as it was (w and b read after the
reductions, LATE = 1); the op reads them a chunk at a time in its output loop since (LATE = 2, as ``ln_full4w``).
Needs a GPU; Liger is optional.

    cd bench && python3 diag_full_rows.py [--bounds] [--long] [--cluster] [--shapes RxC,...] [--json FILE]
"""
import argparse
import re
import sys

import torch

sys.path.insert(0, ".")
from _kernel_timing import beside_kernels, copy_gbps, write_records  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _functional as fn  # noqa: E402
from opsmith.ops import _launch, _norms, _sources  # noqa: E402

try:
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
    from liger_kernel.ops.softmax import _softmax_forward
except ImportError:
    layer_norm_forward = None

LN = """template <class T, class A>
__global__ void __launch_bounds__(BOUNDS)
NAME(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
     A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_row<ROW_FULL, LATE, T, A, CC>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}
"""
RMS = """template <class T, class A>
__global__ void __launch_bounds__(BOUNDS)
NAME(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd, long long rows,
     int cols, A eps, int has_w) {
    rms_norm_fwd_row<ROW_FULL, T, A, CC>(x, w, y, rstd, rows, cols, eps, has_w);
}
"""
SM = """template <class T>
__global__ void __launch_bounds__(BOUNDS)
NAME(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_row<ROW_FULL, CC>(x, y, rows, cols);
}
"""
# name: (template, chunks, launch bounds, LATE)
KERNELS = {"ln_full2": (LN, 2, "512, (RowBlocks<T, 2, 2>::value)", 0), "ln_full2b": (LN, 2, "256, 5", 0),
           "ln_full4": (LN, 4, "256, (RowBlocks<T, 3, 3>::value)", 1),
           "rms_full2": (RMS, 2, "512, (RowBlocks<T, 3, 3>::value)", 0), "rms_full4": (RMS, 4, "256, 3", 0),
           "sm_full2": (SM, 2, "512, 4", 0), "sm_full4": (SM, 4, "256, 4", 0)}
# --bounds: the 4-chunk rows again under tighter register caps (more blocks an SM: ncu.txt's occupancy limit)
BOUNDED = {"ln_full4w": (LN, 4, "256, (RowBlocks<T, 3, 3>::value)", 2), "ln_full4wb": (LN, 4, "256, 4", 2),
           "ln_full4wc": (LN, 4, "256, 5", 2), "ln_full4b": (LN, 4, "256, 4", 1), "ln_full4c": (LN, 4, "256, 5", 1), "rms_full4b": (RMS, 4, "256, 4", 0),
           "rms_full4c": (RMS, 4, "256, 5", 0), "sm_full4b": (SM, 4, "256, 5", 0), "sm_full4c": (SM, 4, "256, 6", 0)}
# --long: softmax's rows of 32 and 64 KiB in one block (the op takes a 2-block cluster at 4 chunks for 16,385-32,768
# columns, softmax_fwd_wide3 at 512 threads for 16,384): 8 chunks of 512 threads (1 or 2 blocks an SM), 4 of 1,024
LONG = {"sm_full8": (SM, 8, "512, 1", 0), "sm_full8b": (SM, 8, "512, 2", 0), "sm_full4k": (SM, 4, "1024, 1", 0)}
# --cluster: softmax_fwd_cluster<K, CH> (softmax_cluster.cu) at other cluster sizes, under _launch._cluster's plan with
# 2 blocks an SM at 2 chunks (64 registers), 1 at 4: the op's is K = 2 at 4 chunks (512 threads, 1 block an SM)
CLUSTERS = [(2, 4), (4, 2), (4, 4), (8, 2)]
SHAPES = [(2048, 2048), (4096, 4096), (8192, 4096), (16384, 4096), (4096, 8192), (65536, 1024), (16384, 2048)]


def _source():
    out = ['#include "norm.cu"', '#include "softmax.cu"']
    for name, (tpl, cc, bounds, late) in KERNELS.items():
        out.append(tpl.replace("NAME", name).replace("BOUNDS", bounds).replace("CC", str(cc))
                   .replace("LATE", str(late)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--bounds", action="store_true", help="also BOUNDED's kernels")
    ap.add_argument("--long", action="store_true", help="also LONG's kernels")
    ap.add_argument("--cluster", action="store_true", help="softmax's forward at CLUSTERS' cluster sizes")
    ap.add_argument("--shapes", help="rowsxcols,... (default: SHAPES)")
    args = ap.parse_args()
    if args.bounds:
        KERNELS.update(BOUNDED)
    if args.long:
        KERNELS.update(LONG)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes else SHAPES
    t, a = _sources.DTYPES["bfloat16"]
    names = {k: (f"{k}<{t}, {a}>" if v[0] is not SM else f"{k}<{t}>") for k, v in KERNELS.items()}
    clusters = {f"sm_cl{k}x{ch}": f"softmax_fwd_cluster<{k}, {ch}, {t}>" for k, ch in (CLUSTERS if args.cluster else [])}
    src = _source() + ('\n#include "softmax_cluster.cu"' if clusters else "")
    mod = CudaModule(beside_kernels("full_rows.cu", src), name_expressions=list(names.values()) + list(clusters.values()),
                     arch=_driver.device_arch(0), name="diag/full_rows.cu", options=["--ptxas-options=-v"])
    regs, fn_name = {}, None
    for line in mod.binary.log.splitlines():
        m = re.search(r"Compiling entry function '\S*?(\w+_full\d\w?)I", line)
        cl = re.search(r"Compiling entry function '\S*?softmax_fwd_clusterILi(\d)ELi(\d)E", line)
        fn_name = m.group(1) if m else f"sm_cl{cl.group(1)}x{cl.group(2)}" if cl else fn_name
        r = re.search(r"Used (\d+) registers", line)
        if r and fn_name:
            regs[fn_name] = int(r.group(1))
        sp = re.search(r"(\d+) bytes spill stores", line)
        if sp and fn_name and int(sp.group(1)):
            regs[fn_name + " spill"] = int(sp.group(1))
    print("registers:", regs)
    records = []
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
        w, b = torch.randn(cols, device="cuda", dtype=x.dtype), torch.randn(cols, device="cuda", dtype=x.dtype)
        y = torch.empty_like(x)
        s1, s2 = (torch.empty(rows, device="cuda", dtype=torch.float32) for _ in range(2))
        nbytes = 2 * x.nbytes
        rec = {"rows": rows, "cols": cols, "copy": copy_gbps(x.nbytes)}
        ops_now = {"ln": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0],
                          layer_norm_forward and (lambda: layer_norm_forward(x, w, b, 1e-5))),
                   "rms": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0],
                           layer_norm_forward and (lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None))),
                   "sm": (lambda: fn.softmax_cuda(x, -1), layer_norm_forward and (lambda: _softmax_forward(x)))}
        for op, (ours, liger) in ops_now.items():
            want = ours()
            rec[f"{op}_op"] = ops.benchmark(ours, bytes_moved=nbytes, runs=200).gbps
            if liger:
                rec[f"{op}_liger"] = ops.benchmark(liger, bytes_moved=nbytes, runs=200).gbps
            for k, (tpl, cc, _, _) in KERNELS.items():
                if not k.startswith(op + "_"):
                    continue
                tpr = cols // 8 // cc
                if tpr > int(KERNELS[k][2].split(",")[0]):
                    continue
                cfg = _launch.launch_config(_launch.Plan("block", (rows,), (tpr, 1), 0, 0))
                kern = mod.get_kernel(names[k])
                if op == "ln":
                    launch = (lambda kern=kern, cfg=cfg: kern.launch(cfg, x, w, b, y, s1, s2, rows, cols, 1e-5, 1, 1))
                elif op == "rms":
                    launch = (lambda kern=kern, cfg=cfg: kern.launch(cfg, x, w, y, s1, rows, cols, 1e-6, 1))
                else:
                    launch = (lambda kern=kern, cfg=cfg: kern.launch(cfg, x, y, rows, cols))
                launch()
                torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2)
                rec[k] = ops.benchmark(launch, bytes_moved=nbytes, runs=200).gbps
            for k, name in clusters.items() if op == "sm" else ():
                kk, ch = map(int, k[len("sm_cl"):].split("x"))
                plan = _launch._cluster(rows, cols, 2, _launch.device_props(0), kk, ch, 2 if ch == 2 else 1, rows)
                if plan.block[0] > 512:
                    continue
                cfg = _launch.launch_config(plan)  # the declaration is in an #included file: its parameters here
                kern = mod.get_kernel(name, signature=f"const {t}* x, {t}* y, long long rows, int cols")
                launch = (lambda kern=kern, cfg=cfg: kern.launch(cfg, x, y, rows, cols))
                launch()
                torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2)
                rec[k] = ops.benchmark(launch, bytes_moved=nbytes, runs=200).gbps
        records.append(rec)
        print(f"{rows:>5}x{cols:<5} " + " ".join(f"{k} {v:5.0f}" for k, v in rec.items() if k not in ("rows", "cols")),
              flush=True)
    write_records(args.json, records)


if __name__ == "__main__":
    main()
