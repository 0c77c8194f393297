// PROTOTYPE (frozen): opsmith/ops/kernels/norm_l2.cu as the variants run (variants.txt) compiled it, with the
// launch variants as template arguments: U chunks a trip, R minimum blocks of 1,024 threads an SM, H the L2
// hints on or off. To rerun: copy this file over opsmith/ops/kernels/norm_l2.cu and run
// this folder's diag_norm_l2_variants.py as bench/diag_norm_l2.py (COMMAND.txt).
#include "common.cuh"

#define OPSMITH_L2_THREADS 1024

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
template <int H> __device__ __forceinline__ Raw ld_l2(const void* p, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (H) {
        Raw r;
        asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
            : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(pol));
        return r;
    }
#endif
    return *reinterpret_cast<const Raw*>(p);
}
}  // namespace opsmith

using namespace opsmith;

#define OPSMITH_L2_TRIPS for (int c0 = t; c0 < nv; c0 += U * tpr)
#define OPSMITH_L2_IN(u) (c0 + (u) * tpr < nv)

template <int U, int R, int H, class T, class A>
__global__ void __launch_bounds__(OPSMITH_L2_THREADS, R)
layer_norm_fwd_l2(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x, nv = cols / N;
    const long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    const unsigned long long keep = l2_keep(), first = l2_first();
    A mu = A(0), m2 = A(0);
    int cnt = 0;
    OPSMITH_L2_TRIPS {
        Raw r[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (OPSMITH_L2_IN(u)) r[u] = ld_l2<H>(xr + (long long)(c0 + u * tpr) * N, keep);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
            A s = A(0);
#pragma unroll
            for (int k = 0; k < N; ++k) s += raw_get<T>(r[u], k);
            const A cm = s * (A(1) / A(N));
            A q = A(0);
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A d = raw_get<T>(r[u], k) - cm;
                q += d * d;
            }
            ++cnt;
            const A f = A(1) / A(cnt), delta = cm - mu;
            mu += delta * f;
            m2 += q + delta * delta * (A(N) * A(cnt - 1) * f);
        }
    }
    const A n_t = A(N) * A(cnt);
    const A mu_row = row_allreduce(mu * n_t, SumOp(), A(0), tpr) / A(cols);
    const A dm = mu - mu_row;
    const A var = row_allreduce(m2 + n_t * dm * dm, SumOp(), A(0), tpr) / A(cols);
    const A rs = m_rsqrt(var + eps);
    if (t == 0) {
        mean[row] = mu_row;
        rstd[row] = rs;
    }
    OPSMITH_L2_TRIPS {
        Raw r[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (OPSMITH_L2_IN(u)) r[u] = ld_l2<H>(xr + (long long)(c0 + u * tpr) * N, first);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
            const int j = (c0 + u * tpr) * N;
            const Raw wr = has_w ? *reinterpret_cast<const Raw*>(w + j) : Raw{};
            const Raw br = has_b ? *reinterpret_cast<const Raw*>(b + j) : Raw{};
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                A v = (raw_get<T>(r[u], k) - mu_row) * rs;
                if (has_w) v *= raw_get<T>(wr, k);
                if (has_b) v += raw_get<T>(br, k);
                o[k] = v;
            }
            *reinterpret_cast<Raw*>(yr + j) = raw_pack<T>(o);
        }
    }
}

template <int U, int R, int H, class T, class A>
__global__ void __launch_bounds__(OPSMITH_L2_THREADS, R)
rms_norm_fwd_l2(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                long long rows, int cols, A eps, int has_w) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x, nv = cols / N;
    const long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    const unsigned long long keep = l2_keep(), first = l2_first();
    A q = A(0);
    OPSMITH_L2_TRIPS {
        Raw r[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (OPSMITH_L2_IN(u)) r[u] = ld_l2<H>(xr + (long long)(c0 + u * tpr) * N, keep);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = raw_get<T>(r[u], k);
                q += v * v + nonfinite(v);
            }
        }
    }
    const A rs = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (t == 0) rstd[row] = rs;
    OPSMITH_L2_TRIPS {
        Raw r[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (OPSMITH_L2_IN(u)) r[u] = ld_l2<H>(xr + (long long)(c0 + u * tpr) * N, first);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
            const int j = (c0 + u * tpr) * N;
            const Raw wr = has_w ? *reinterpret_cast<const Raw*>(w + j) : Raw{};
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = raw_get<T>(r[u], k) * rs;
                o[k] = has_w ? v * raw_get<T>(wr, k) : v;
            }
            *reinterpret_cast<Raw*>(yr + j) = raw_pack<T>(o);
        }
    }
}
