// PROTOTYPE (not shipped): the row forwards streamed through shared memory by bulk async copies (sm_90+).
// A persistent block keeps `stages` tiles of `ry` rows in flight (cp.async.bulk into shared memory, one
// mbarrier a stage); each tile is reduced and written from shared memory in passes.
#include "rows.cuh"

namespace opsmith {
__device__ __forceinline__ unsigned sm_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                          unsigned long long pol, int hint) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
    if (hint)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                     :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void st_hint(void* p, const Raw& r, int cs) {
    if (cs)
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(r.u[0]), "r"(r.u[1]), "r"(r.u[2]), "r"(r.u[3]) : "memory");
    else
        *reinterpret_cast<Raw*>(p) = r;
}
}  // namespace opsmith
using namespace opsmith;

#ifndef PROTO_U
#define PROTO_U 2
#endif

// OP 0 softmax, 1 rms_norm (w), 2 layer_norm (w, b; mean, rstd out)
template <int OP, class T>
__global__ void __launch_bounds__(1024, 1)
row_stream(const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ w, const T* __restrict__ b,
           float* __restrict__ st1, float* __restrict__ st2, long long rows, int cols, int stages, float eps,
           int hint, int cs) {
    typedef float A;
    constexpr int N = Vec<T>::N, U = PROTO_U;
    const int tpr = blockDim.x, t = threadIdx.x, ry = blockDim.y, nv = cols / N;
    const unsigned tid = t + threadIdx.y * tpr;
    __shared__ __align__(8) unsigned long long bars[16];
    T* sm = reinterpret_cast<T*>(opsmith_dyn_smem);
    const long long tiles = (rows + ry - 1) / ry, tile_elems = (long long)ry * cols;
    unsigned long long pol = 0;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    if (tid == 0) {
        for (int s = 0; s < stages; ++s)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sm_addr(&bars[s])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](long long tile, int s) {
        const long long r0 = tile * ry;
        const long long nr = rows - r0 < ry ? rows - r0 : ry;
        bulk_load(sm_addr(sm + s * tile_elems), x + r0 * cols, (unsigned)(nr * cols * sizeof(T)), sm_addr(&bars[s]),
                  pol, hint);
    };
    if (tid == 0)
        for (int s = 0; s < stages; ++s) {
            const long long tile = blockIdx.x + (long long)s * gridDim.x;
            if (tile < tiles) issue(tile, s);
        }
    for (long long k = 0;; ++k) {
        const long long tile = blockIdx.x + k * gridDim.x;
        if (tile >= tiles) break;
        const int s = (int)(k % stages);
        mbar_wait(sm_addr(&bars[s]), (unsigned)((k / stages) & 1));
        const long long row = tile * ry + threadIdx.y;
        const bool active = row < rows;
        const T* xr = sm + s * tile_elems + (long long)threadIdx.y * cols;
        T* yr = y + (active ? row : 0) * cols;
        const int nva = active ? nv : 0;
        A a1 = OP == 0 ? neg_inf<A>() : A(0);
        // pass 1: max (softmax), sum of squares (rms), sum (layer_norm)
        for (int c0 = t; c0 < nva; c0 += U * tpr) {
            Raw r[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (c0 + u * tpr < nva) r[u] = *reinterpret_cast<const Raw*>(xr + (c0 + u * tpr) * N);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (c0 + u * tpr >= nva) break;
#pragma unroll
                for (int kk = 0; kk < N; ++kk) {
                    const A v = raw_get<T>(r[u], kk);
                    if (OP == 0) a1 = m_max(a1, v);
                    else if (OP == 1) a1 += v * v;
                    else a1 += v;
                }
            }
        }
        A s1, s2 = A(0);
        if (OP == 0) {
            s1 = row_allreduce(a1, MaxOp(), neg_inf<A>(), tpr);
        } else {
            s1 = row_allreduce(a1, SumOp(), A(0), tpr);
        }
        if (OP != 1) {  // pass 2: sum of exp (softmax), squared deviations (layer_norm)
            const A mu = s1 / A(cols);
            A a2 = A(0);
            for (int c0 = t; c0 < nva; c0 += U * tpr) {
                Raw r[U];
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (c0 + u * tpr < nva) r[u] = *reinterpret_cast<const Raw*>(xr + (c0 + u * tpr) * N);
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    if (c0 + u * tpr >= nva) break;
#pragma unroll
                    for (int kk = 0; kk < N; ++kk) {
                        const A v = raw_get<T>(r[u], kk);
                        if (OP == 0) a2 += m_exp2_ftz((v - s1) * log2e<A>());
                        else { const A d = v - mu; a2 += d * d; }
                    }
                }
            }
            s2 = row_allreduce(a2, SumOp(), A(0), tpr);
        }
        A scale, shift;
        if (OP == 0) { scale = A(1) / s2; shift = s1; }
        else if (OP == 1) { scale = m_rsqrt(s1 / A(cols) + eps); shift = A(0); }
        else { scale = m_rsqrt(s2 / A(cols) + eps); shift = s1 / A(cols); }
        if (OP != 0 && active && t == 0) {
            if (OP == 2) { st1[row] = shift; st2[row] = scale; } else st1[row] = scale;
        }
        // last pass: write
        for (int c0 = t; c0 < nva; c0 += U * tpr) {
            Raw r[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (c0 + u * tpr < nva) r[u] = *reinterpret_cast<const Raw*>(xr + (c0 + u * tpr) * N);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c0 + u * tpr;
                if (c >= nva) break;
                Raw wr, br;
                if (OP != 0) wr = *reinterpret_cast<const Raw*>(w + c * N);
                if (OP == 2) br = *reinterpret_cast<const Raw*>(b + c * N);
                A o[N];
#pragma unroll
                for (int kk = 0; kk < N; ++kk) {
                    const A v = raw_get<T>(r[u], kk);
                    if (OP == 0) o[kk] = m_exp2_ftz((v - shift) * log2e<A>()) * scale;
                    else if (OP == 1) o[kk] = v * scale * raw_get<T>(wr, kk);
                    else o[kk] = (v - shift) * scale * raw_get<T>(wr, kk) + raw_get<T>(br, kk);
                }
                st_hint(yr + c * N, raw_pack<T>(o), cs);
            }
        }
        __syncthreads();  // every thread is done with stage s
        if (tid == 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const long long nt = tile + (long long)stages * gridDim.x;
            if (nt < tiles) issue(nt, s);
        }
    }
}
