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
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
add_rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                 T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                 A eps, int has_w) {
    OPSMITH_ROW_SETUP
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(residual) && aligned16(y) &&
                     aligned16(residual_out) && aligned16(w);
    // x, residual and the weight as loaded, all read before the reduction; the row
    // s = x + residual, rounded to T as the residual stream holds it, replaces x
    Raw in[3][C];
    load_chunks<T, 3>({x + base, residual + base, w}, in, n, vec, tpr, t, has_w ? 7u : 3u);
    A q = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const T e = Elem<T>::store(raw_get<T>(in[0][c], k) + raw_get<T>(in[1][c], k));
            raw_put<T>(in[0][c], k, e);
            const A v = Elem<T>::load(e);
            q += v * v + nonfinite(v);
        }
        store_chunk<T>(residual_out + base, (long long)(c * tpr + t) * N, n, vec, in[0][c]);  // idle rows: n = 0
    }
    const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (!active) return;
    if (t == 0) rstd[row] = r;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A v = raw_get<T>(in[0][c], k) * r;
            o[k] = has_w ? v * raw_get<T>(in[2][c], k) : v;
        }
        store_vec(y + base, (long long)(c * tpr + t) * N, n, vec, o);
    }
}
