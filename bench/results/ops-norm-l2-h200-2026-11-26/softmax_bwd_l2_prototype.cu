// opsmith.ops softmax backward in two passes over a row held in L2 (the "l2" strategy of
// opsmith/ops/_launch.py's softmax_plan; norm_l2.cu has the forwards' form of it): one block a row, one
// 16-byte chunk of grad_y and of y a thread a trip (U of each, their loads issued together), 32 registers,
// so that an SM holds 2,048 threads. The first pass sums grad_y * y, reading both asking L2 to keep them
// (evict_last); the second reads them again from L2 (evict_first) and writes grad_x = y * (grad_y - sum).
// HBM sees one read of each and one write. Widths a multiple of 16 bytes, 16-byte-aligned pointers.
#include "common.cuh"

#ifndef OPSMITH_L2_THREADS
#define OPSMITH_L2_THREADS 1024  // the most threads a block (_launch.L2_THREADS)
#endif

namespace opsmith {
__device__ __forceinline__ unsigned long long l2_keep() {
    unsigned long long p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}
__device__ __forceinline__ unsigned long long l2_first() {
    unsigned long long p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}
__device__ __forceinline__ Raw ld_l2(const void* p, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    Raw r;
    asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(pol));
    return r;
#else
    return *reinterpret_cast<const Raw*>(p);
#endif
}
}  // namespace opsmith

using namespace opsmith;

template <int U, int R, class T>
__global__ void __launch_bounds__(OPSMITH_L2_THREADS, R)
softmax_bwd_l2(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x, long long rows,
               int cols) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x, nv = cols / N;
    const unsigned long long keep = l2_keep(), first = l2_first();
    const long long base = (long long)blockIdx.x * cols;
    const T* gr = grad_y + base;
    const T* yr = y + base;
    A d = A(0);
    for (int c0 = t; c0 < nv; c0 += U * tpr) {
        Raw g[U], v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (c0 + u * tpr < nv) {
                g[u] = ld_l2(gr + (long long)(c0 + u * tpr) * N, keep);
                v[u] = ld_l2(yr + (long long)(c0 + u * tpr) * N, keep);
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u * tpr >= nv) break;
#pragma unroll
            for (int k = 0; k < N; ++k) d += raw_get<T>(g[u], k) * raw_get<T>(v[u], k);
        }
    }
    d = row_allreduce(d, SumOp(), A(0), tpr);
    for (int c0 = t; c0 < nv; c0 += U * tpr) {
        Raw g[U], v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (c0 + u * tpr < nv) {
                g[u] = ld_l2(gr + (long long)(c0 + u * tpr) * N, first);
                v[u] = ld_l2(yr + (long long)(c0 + u * tpr) * N, first);
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u * tpr >= nv) break;
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) o[k] = raw_get<T>(v[u], k) * (raw_get<T>(g[u], k) - d);
            *reinterpret_cast<Raw*>(grad_x + base + (long long)(c0 + u * tpr) * N) = raw_pack<T>(o);
        }
    }
}
