// opsmith.ops fused residual add + RMSNorm (what a pre-norm transformer block does between its
// sublayers): s = x + residual, y = s * rstd * w, rstd = 1 / sqrt(mean(s^2) + eps). The kernel
// writes s (the new residual, rounded to T as the residual stream holds it) and y in one pass
// over x and residual, and saves rstd for the backward, which is rms_norm's on s.
//
// The register-row strategy of norm.cu (the row in registers, tpr threads a row); rows too long
// for it are served by the caller as an add and rms_norm_fwd_long (opsmith/ops/_fused.py).
// inf and NaN as rms_norm: a nonfinite element makes the row NaN.
#include "common.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif

using namespace opsmith;

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS)
add_rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                 T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                 A eps, int has_w) {
    OPSMITH_ROW_SETUP
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(residual) && aligned16(y) &&
                     aligned16(residual_out) && aligned16(w);
    A v[C * N];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const long long j = (long long)(c * tpr + t) * N;
        A rv[N];
        load_vec(x + base, j, n, vec, v + c * N, A(0));
        load_vec(residual + base, j, n, vec, rv, A(0));
#pragma unroll
        for (int k = 0; k < N; ++k) v[c * N + k] = Elem<T>::load(Elem<T>::store(v[c * N + k] + rv[k]));
        store_vec(residual_out + base, j, n, vec, v + c * N);  // n = 0 on idle rows: nothing written
    }
    A q = A(0);
#pragma unroll
    for (int i = 0; i < C * N; ++i) q += v[i] * v[i] + nonfinite(v[i]);
    const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (!active) return;
    if (t == 0) rstd[row] = r;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const long long j = (long long)(c * tpr + t) * N;
        A wv[N];
        if (has_w) load_vec(w, j, n, vec, wv, A(1));
#pragma unroll
        for (int k = 0; k < N; ++k) v[c * N + k] = has_w ? v[c * N + k] * r * wv[k] : v[c * N + k] * r;
        store_vec(y + base, j, n, vec, v + c * N);
    }
}
