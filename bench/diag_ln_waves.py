#!/usr/bin/env python3
"""The norm forwards on 2 to 16 KiB rows (norm_c4_plan: a block a row of 4 chunks a thread, 80 registers, 6 blocks
of 128 threads an SM) where the rows are few for the device (2,048 to 16,384): layer_norm bf16 4096x4096 ran at
2,358 GB/s against rms_norm's 2,614 and Liger-Kernel's 2,533 (H100, bench/results/ops-small-bwd-h100-2026-11-27/).
Variants of the row, compiled here as extra kernels from norm_fwd.cuh's rows:

- ``c4``: the shipped row (w and b read after the reductions), ``c4e``: w and b read with x;
- ``chan``: one reduction a row instead of two: each thread's (mean, squared deviations) of its own elements, merged
  pairwise over the row (Chan et al.: equal counts at every step of a butterfly), w and b after (tried on an H200
  before, 0.74-1.01x: docs/ops.md; here on the H100's few rows);
- ``*_b4``: ``c4`` at launch bounds of 4 blocks of 256 threads (64 registers: 8 blocks of 128 an SM);
- ``c2``: 2 chunks a thread (twice the threads a row); rms_norm's ``c4``, ``c4_b4`` and ``c2`` likewise.

Each against the shipped op, Liger-Kernel (torch.compile's figures are in the peers runs) and a copy of the same
bytes, GB/s of the bytes-moved floor with the L2 flushed (opsmith.ops.benchmark, median of 100); each result checked
against the shipped op's. Needs a GPU; Liger is optional (PYTHONPATH to its wheel's files).

    python3 bench/diag_ln_waves.py [--out FILE.json]
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from _kernel_timing import beside_kernels, copy_gbps  # noqa: E402  (bench/, this script's folder)
from opsmith import ops  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _launch, _norms, _sources  # noqa: E402

try:
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
except ImportError:
    layer_norm_forward = None

EXTRA = r"""
#include "norm_fwd.cuh"
namespace opsmith {
// one butterfly step: this lane's (mean m, squared deviations q) of 2 * half elements merged with lane ^ o's
template <class A> __device__ __forceinline__ void chan_merge(A& m, A& q, A& half, int o) {
    const A mo = __shfl_xor_sync(0xffffffffu, m, o), qo = __shfl_xor_sync(0xffffffffu, q, o);
    const A d = mo - m;
    q = (q + qo) + d * d * half;
    m = (m + mo) * A(0.5);
    half *= A(2);
}

// layer_norm's row with one reduction: Chan's pairwise merge of (mean, squared deviations) at equal counts
template <int LATE, class T, class A, int CC>
__device__ __forceinline__ void ln_chan_row(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                            T* __restrict__ y, A* __restrict__ mean, A* __restrict__ rstd,
                                            long long rows, int cols, A eps, int has_w, int has_b) {
    OPSMITH_ROW_SETUP_C(CC)
    __shared__ A pm[32], pq[32];
    Raw in[1][C], wb[2][C];
    const unsigned on = (has_w ? 1u : 0u) | (has_b ? 2u : 0u);
    load_chunks<T, 1>({x + base}, in, n, true, tpr, t);
    if (!LATE) load_chunks<T, 2>({w, b}, wb, n, true, tpr, t, on);
    A p[4] = {A(0), A(0), A(0), A(0)};
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) p[k & 3] += OPSMITH_E(in[0], c, k);
    A m = ((p[0] + p[1]) + (p[2] + p[3])) * A(1.0 / (C * N));
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A d = OPSMITH_E(in[0], c, k) - m;
            p[k & 3] += d * d;
        }
    A q = (p[0] + p[1]) + (p[2] + p[3]);
    A half = A(C * N) * A(0.5);  // half the count of each side of a merge
    const int width = tpr < 32 ? tpr : 32;
    for (int o = 1; o < width; o <<= 1) chan_merge(m, q, half, o);
    if (tpr > 32) {
        const int lane = t & 31, warps = tpr >> 5;
        if (lane == 0) { pm[t >> 5] = m; pq[t >> 5] = q; }
        __syncthreads();
        m = pm[lane < warps ? lane : 0];
        q = pq[lane < warps ? lane : 0];
        for (int o = 1; o < warps; o <<= 1) chan_merge(m, q, half, o);
        m = __shfl_sync(0xffffffffu, m, 0);
        q = __shfl_sync(0xffffffffu, q, 0);
    }
    const A mu = m, r = m_rsqrt(q / A(cols) + eps);
    if (!active) return;
    if (LATE) load_chunks<T, 2>({w, b}, wb, n, true, tpr, t, on);
    if (t == 0) { mean[row] = mu; rstd[row] = r; }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            o[k] = (OPSMITH_E(in[0], c, k) - mu) * r;
            if (has_w) o[k] *= OPSMITH_E(wb[0], c, k);
            if (has_b) o[k] += OPSMITH_E(wb[1], c, k);
        }
        store_vals<ROW_FULL>(y + base, (c * tpr + t) * N, n, o);
    }
}
}  // namespace opsmith
using namespace opsmith;
"""
LN_ARGS = ("const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y, "
           "A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b")
RMS_ARGS = ("const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd, "
            "long long rows, int cols, A eps, int has_w")
# name: (op, chunks, launch bounds (threads, blocks), body); every shape below is ROW_FULL (powers of two)
VARIANTS = {
    "ln_c4": ("layer_norm", 4, (256, 3), "layer_norm_fwd_row<ROW_FULL, 1, T, A, 4>"),
    "ln_c4e": ("layer_norm", 4, (256, 3), "layer_norm_fwd_row<ROW_FULL, 0, T, A, 4>"),
    "ln_chan": ("layer_norm", 4, (256, 3), "ln_chan_row<1, T, A, 4>"),
    "ln_c4_b4": ("layer_norm", 4, (256, 4), "layer_norm_fwd_row<ROW_FULL, 1, T, A, 4>"),
    "ln_c2": ("layer_norm", 2, (1024, 1), "layer_norm_fwd_row<ROW_FULL, 1, T, A, 2>"),
    "rms_c4": ("rms_norm", 4, (256, 3), "rms_norm_fwd_row<ROW_FULL, T, A, 4>"),
    "rms_c4_b4": ("rms_norm", 4, (256, 4), "rms_norm_fwd_row<ROW_FULL, T, A, 4>"),
    "rms_c2": ("rms_norm", 2, (1024, 1), "rms_norm_fwd_row<ROW_FULL, T, A, 2>"),
}
for _name, (_op, _c, (_th, _bl), _body) in VARIANTS.items():
    _args = LN_ARGS if _op == "layer_norm" else RMS_ARGS
    _call = ("x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b" if _op == "layer_norm"
             else "x, w, y, rstd, rows, cols, eps, has_w")
    EXTRA += f"""
template <class T, class A>
__global__ void __launch_bounds__({_th}, {_bl}) v_{_name}({_args}) {{
    {_body}({_call});
}}
"""
SHAPES = [(torch.bfloat16, r, c) for r, c in ((2048, 2048), (4096, 2048), (8192, 2048), (2048, 4096), (4096, 4096),
                                               (8192, 4096), (16384, 4096), (4096, 8192), (8192, 8192))]
SHAPES += [(torch.float32, r, c) for r, c in ((4096, 1024), (4096, 2048), (8192, 2048))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    src = beside_kernels("norm_waves.cu", EXTRA)
    mods, records, logs = {}, [], {}
    for dt, rows, cols in SHAPES:
        dts = str(dt)[6:]
        t, a = _sources.DTYPES[dts]
        if dts not in mods:
            mods[dts] = CudaModule(src, name_expressions=[f"v_{n}<{t}, {a}>" for n in VARIANTS],
                                   arch=_driver.device_arch(0), name="diag/norm_waves.cu",
                                   options=["--ptxas-options=-v"])
            logs[dts] = [ln for ln in mods[dts].binary.log.splitlines() if "Used" in ln or "spill" in ln]
        mod = mods[dts]
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        moved = 2 * x.nbytes
        y = torch.empty_like(x)
        st = torch.empty(rows, device="cuda", dtype=torch.float32)
        st2 = torch.empty_like(st)
        ref = {"layer_norm": _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0].clone(),
               "rms_norm": _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0].clone()}
        gbps = {"copy": copy_gbps(x.nbytes)}
        bench = lambda f: ops.benchmark(f, bytes_moved=moved).gbps  # noqa: E731
        gbps["layer_norm"] = bench(lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5))
        gbps["rms_norm"] = bench(lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6))
        if layer_norm_forward is not None:
            gbps["ln_liger"] = bench(lambda: layer_norm_forward(x, w, b, 1e-5))
            gbps["rms_liger"] = bench(lambda: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None))
        vec = 16 // x.element_size()
        for name, (op, chunks, (threads, _), _) in VARIANTS.items():
            tpr = cols // vec // chunks
            if tpr > threads or tpr < 1:
                continue
            cfg = _launch.launch_config(_launch.Plan("block", (rows,), (tpr, 1), 0, 0))
            k = mod.get_kernel(f"v_{name}<{t}, {a}>")
            if op == "layer_norm":
                run = lambda k=k, cfg=cfg: k.launch(cfg, x, w, b, y, st, st2, rows, cols, 1e-5, 1, 1)  # noqa: E731
            else:
                run = lambda k=k, cfg=cfg: k.launch(cfg, x, w, y, st, rows, cols, 1e-6, 1)  # noqa: E731
            run()
            torch.testing.assert_close(y, ref[op], rtol=2e-2, atol=2e-2)
            gbps[name] = bench(run)
        records.append({"dtype": dts, "rows": rows, "cols": cols, "gbps": gbps})
        print(f"{dts:<8} {rows:>5}x{cols:<5} " + " ".join(f"{k} {v:.0f}" for k, v in gbps.items()), flush=True)
    for dts, lines in logs.items():
        print(dts, "\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "variants": {k: v[:3] for k, v in VARIANTS.items()},
                                              "ptxas": logs, "records": records}, indent=1))


if __name__ == "__main__":
    main()
