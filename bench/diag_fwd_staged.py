#!/usr/bin/env python3
"""The norm forwards with the row staged in shared memory (sm_80+ cp.async, 16 bytes a thread a chunk; sm_90+
cp.async.bulk, one copy a row, an mbarrier waited on), read once from HBM, the sums and the output from shared
memory: few registers a thread, so an SM holds as many rows in flight as its shared memory takes (6 of 32 KiB,
3 of 64 KiB), where the register rows hold 2 and norm_l2.cu's two passes read the row a second time from L2. Against
the shipped plan and torch.compile(dynamic=False) (compile's fp32 rms_norm read 4,323 GB/s at 65536x8192 on the
H200 where ours read 4,043), kernels alone (torch.profiler, us a call) as GB/s of the bytes-moved floor beside a
copy of the same bytes, each output checked against the shipped one. Needs a GPU of sm_90 or later.

    python3 bench/diag_fwd_staged.py [--out FILE.json] [--no-compile]
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from _kernel_timing import beside_kernels  # noqa: E402  (bench/, this script's folder)
from diag_norm_split import per_kernel  # noqa: E402
from opsmith._runtime import _driver  # noqa: E402
from opsmith._torch._cuda_module import CudaModule  # noqa: E402
from opsmith.ops import _launch, _norms, _sources  # noqa: E402

SRC = r"""
#include "norm_l2.cu"
using namespace opsmith;

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// The row's nv chunks at xr into buf: MODE 0 cp.async, each thread its own chunks (c = t + k * tpr: only it reads
// them back, no barrier); MODE 1/2 one cp.async.bulk a row by thread 0, every thread waits on the mbarrier.
template <int MODE>
__device__ __forceinline__ void stage_row(const void* xr, Raw* buf, int nv, int tpr, int t, unsigned long long pol,
                                          unsigned long long* bar) {
    if constexpr (MODE == 0) {
        const Raw* src = reinterpret_cast<const Raw*>(xr);
#pragma unroll 8
        for (int c = t; c < nv; c += tpr)
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                         :: "r"(smem_u32(buf + c)), "l"(src + c), "l"(pol) : "memory");
        asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
    } else {
        const unsigned b = smem_u32(bar);
        if (t == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(nv * 16) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                         "[%0], [%1], %2, [%3], %4;"
                         :: "r"(smem_u32(buf)), "l"(xr), "r"(nv * 16), "r"(b), "l"(pol) : "memory");
        }
        __syncthreads();  // the barrier initialised
        unsigned done = 0;
        while (!done)
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(b) : "memory");
    }
}

// y's row: MODE 2 from buf (each thread's outputs written there in place) by one bulk store; else the threads'
template <int MODE>
__device__ __forceinline__ void finish_row(void* yr, Raw* buf, int nv, int t) {
    if constexpr (MODE == 2) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (t == 0) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                         :: "l"(yr), "r"(smem_u32(buf)), "r"(nv * 16) : "memory");
            asm volatile("cp.async.bulk.commit_group;\n\tcp.async.bulk.wait_group.read 0;" ::: "memory");
        }
    }
}

template <int MODE, class T, class A>
__global__ void __launch_bounds__(1024)
diag_rms_norm_fwd_sm(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                     long long rows, int cols, A eps, int has_w) {
    constexpr int N = Vec<T>::N;
    __shared__ unsigned long long bar;
    const int tpr = blockDim.x, t = threadIdx.x, nv = cols / N;
    const long long row = blockIdx.x;
    Raw* buf = reinterpret_cast<Raw*>(opsmith_dyn_smem);
    const unsigned long long keep = l2_keep(), first = l2_first();
    stage_row<MODE>(x + row * cols, buf, nv, tpr, t, first, &bar);
    A q = A(0);
#pragma unroll 8
    for (int c = t; c < nv; c += tpr) {
        const Raw r = buf[c];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A v = raw_get<T>(r, k);
            q += v * v + nonfinite(v);
        }
    }
    const A rs = m_rsqrt(row_allreduce<true>(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (t == 0) rstd[row] = rs;
    T* yr = y + row * cols;
#pragma unroll 4
    for (int c = t; c < nv; c += tpr) {
        const Raw r = buf[c];
        const Raw wr = has_w ? ld_l2(w + (long long)c * N, keep) : Raw{};
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = has_w ? raw_get<T>(r, k) * rs * raw_get<T>(wr, k) : raw_get<T>(r, k) * rs;
        if constexpr (MODE == 2) buf[c] = raw_pack<T>(o);
        else *reinterpret_cast<Raw*>(yr + (long long)c * N) = raw_pack<T>(o);
    }
    finish_row<MODE>(yr, buf, nv, t);
}

template <int MODE, class T, class A>
__global__ void __launch_bounds__(1024)
diag_layer_norm_fwd_sm(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                       A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                       int has_b) {
    constexpr int N = Vec<T>::N;
    __shared__ unsigned long long bar;
    const int tpr = blockDim.x, t = threadIdx.x, nv = cols / N;
    const long long row = blockIdx.x;
    Raw* buf = reinterpret_cast<Raw*>(opsmith_dyn_smem);
    const unsigned long long keep = l2_keep(), first = l2_first();
    stage_row<MODE>(x + row * cols, buf, nv, tpr, t, first, &bar);
    A s = A(0);
#pragma unroll 8
    for (int c = t; c < nv; c += tpr) {
        const Raw r = buf[c];
#pragma unroll
        for (int k = 0; k < N; ++k) s += raw_get<T>(r, k);
    }
    const A mu = row_allreduce<true>(s, SumOp(), A(0), tpr) / A(cols);
    A q = A(0);
#pragma unroll 8
    for (int c = t; c < nv; c += tpr) {
        const Raw r = buf[c];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A d = raw_get<T>(r, k) - mu;
            q += d * d;
        }
    }
    const A rs = m_rsqrt(row_allreduce<true>(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (t == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    T* yr = y + row * cols;
#pragma unroll 4
    for (int c = t; c < nv; c += tpr) {
        const Raw r = buf[c];
        const Raw wr = has_w ? ld_l2(w + (long long)c * N, keep) : Raw{};
        const Raw br = has_b ? ld_l2(b + (long long)c * N, keep) : Raw{};
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            A v = (raw_get<T>(r, k) - mu) * rs;
            if (has_w) v *= raw_get<T>(wr, k);
            if (has_b) v += raw_get<T>(br, k);
            o[k] = v;
        }
        if constexpr (MODE == 2) buf[c] = raw_pack<T>(o);
        else *reinterpret_cast<Raw*>(yr + (long long)c * N) = raw_pack<T>(o);
    }
    finish_row<MODE>(yr, buf, nv, t);
}
"""
SHAPES = [(torch.float32, r, c) for r, c in ((8192, 8192), (32768, 8192), (65536, 8192), (4096, 16384),
                                              (8192, 16384), (4096, 24576), (2048, 32768))]
SHAPES += [(torch.bfloat16, r, c) for r, c in ((32768, 8192), (4096, 16384), (16384, 16384), (4096, 32768),
                                               (2048, 65536))]
MODES = {"cp": 0, "bulk": 1, "bulk2": 2}
THREADS = (256, 512, 1024)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    arch = _driver.device_arch(0)
    src = beside_kernels("norm_staged.cu", SRC)
    mods, records = {}, []
    for dt, rows, cols in SHAPES:
        dts = str(dt)[6:]
        t, a = _sources.DTYPES[dts]
        if dts not in mods:
            names = [f"diag_{op}_fwd_sm<{m}, {t}, {a}>" for op in ("layer_norm", "rms_norm") for m in MODES.values()]
            mods[dts] = CudaModule(src, name_expressions=names, arch=arch, name=f"diag-staged-{dts}",
                                   options=["--ptxas-options=-v"])
        mod = mods[dts]
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3 + 1
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        gb = 2 * rows * cols * x.element_size() / 1e3
        out = torch.empty_like(x)
        copy = gb / sum(per_kernel(lambda: out.copy_(x)).values())
        vecs = cols // (16 // x.element_size())
        y = torch.empty_like(x)
        st, st2 = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
        smem = vecs * 16

        def cfg(threads):
            return _launch.launch_config(_launch.Plan("block", (rows,), (threads, 1), smem, 0))

        def ln_k(name, threads):
            k, c = mod.get_kernel(name), cfg(threads)
            return lambda: (k.launch(c, x, w, b, y, st, st2, rows, cols, 1e-5, 1, 1), y)[1]

        def rms_k(name, threads):
            k, c = mod.get_kernel(name), cfg(threads)
            return lambda: (k.launch(c, x, w, y, st, rows, cols, 1e-6, 1), y)[1]

        torch._dynamo.reset()
        cases = {
            "layer_norm": (lambda: _norms.layer_norm_fwd(x, [cols], w, b, 1e-5)[0], ln_k,
                           None if args.no_compile else
                           torch.compile(lambda: F.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False)),
            "rms_norm": (lambda: _norms.rms_norm_fwd(x, [cols], w, 1e-6)[0], rms_k,
                         None if args.no_compile else
                         torch.compile(lambda: F.rms_norm(x, (cols,), w, 1e-6), dynamic=False)),
        }
        for op, (ours, mk, comp) in cases.items():
            variants = {"shipped": ours}
            for mname, m in MODES.items():
                for th in THREADS:
                    if th <= vecs:
                        variants[f"{mname}{th}"] = mk(f"diag_{op}_fwd_sm<{m}, {t}, {a}>", th)
            ref = ours().clone()
            if comp:
                variants["compile"] = comp
            rec = {"op": op, "dtype": dts, "rows": rows, "cols": cols, "copy": copy}
            for v, f in variants.items():
                if v != "compile":
                    got = f()
                    rec[f"{v}_maxdiff"] = float((got.float() - ref.float()).abs().max())
                rec[v] = gb / sum(per_kernel(f).values())
            records.append(rec)
            cells = "  ".join(f"{v} {rec[v]:5.0f}" for v in variants)
            best = max((rec[v], v) for v in variants if v not in ("compile", "shipped"))
            bad = [v for v in variants if rec.get(f"{v}_maxdiff", 0) > 0.05]
            print(f"{op:<11} {dts:<8} {rows:>5}x{cols:<6} {cells}  copy {copy:5.0f}  best {best[1]} "
                  f"{best[0] / rec['shipped']:.3f}x shipped{'  WRONG ' + ','.join(bad) if bad else ''}", flush=True)
    for dts, mod in mods.items():
        lines = [ln for ln in mod.binary.log.splitlines() if "registers" in ln or "spill" in ln or "Function" in ln]
        print(f"-- {dts}\n" + "\n".join(lines[:24]))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "command": " ".join(sys.argv), "records": records}, indent=1))


if __name__ == "__main__":
    main()
