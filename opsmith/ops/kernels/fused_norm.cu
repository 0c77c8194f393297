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
    // the row (s = x + residual, rounded to T as the residual stream holds it) and the weight
    // stay in T: half the registers of floats for 16-bit types
    Vec<T> sr[C], wr[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const long long j = (long long)(c * tpr + t) * N;
        Vec<T> rr;
        load_raw(x + base, j, n, vec, sr[c]);
        load_raw(residual + base, j, n, vec, rr);
        if (has_w) load_raw(w, j, (long long)cols, vec, wr[c]);  // read before the reduction
#pragma unroll
        for (int k = 0; k < N; ++k) sr[c].v[k] = Elem<T>::store(Elem<T>::load(sr[c].v[k]) + Elem<T>::load(rr.v[k]));
        store_raw(residual_out + base, j, n, vec, sr[c]);  // n = 0 on idle rows: nothing written
    }
    A q = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A v = Elem<T>::load(sr[c].v[k]);
            q += v * v + nonfinite(v);
        }
    const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (!active) return;
    if (t == 0) rstd[row] = r;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A v = Elem<T>::load(sr[c].v[k]) * r;
            o[k] = has_w ? v * Elem<T>::load(wr[c].v[k]) : v;
        }
        store_vec(y + base, (long long)(c * tpr + t) * N, n, vec, o);
    }
}
