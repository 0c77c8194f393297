// PROTOTYPE: softmax_fwd_wide variants (occupancy): the shipped row at other launch bounds, and a row that
// keeps the loaded chunks packed and computes each exp twice (fewer registers, more blocks an SM).
#include "softmax.cu"

template <class T, int TPB, int MINB>
__global__ void __launch_bounds__(TPB, MINB) sm_wide_lb(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_any<OPSMITH_WIDE_CHUNKS>(x, y, rows, cols);
}

// ROW_FULL rows only (the caller's): packed chunks, max, sum of exp, then exp again scaled
template <class T, int TPB, int MINB>
__global__ void __launch_bounds__(TPB, MINB) sm_wide_rc(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N, C = OPSMITH_WIDE_CHUNKS;
    const int tpr = blockDim.x, t = threadIdx.x;
    const long long row = blockIdx.x;
    const long long base = row * (long long)cols;
    Raw in[1][C];
    load_chunks<T, 1>({x + base}, in, cols, true, tpr, t);
    A p[4] = {neg_inf<A>(), neg_inf<A>(), neg_inf<A>(), neg_inf<A>()};
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) p[k & 3] = m_max(p[k & 3], raw_get<T>(in[0][c], k));
    const A m = row_allreduce<true>(m_max(m_max(p[0], p[1]), m_max(p[2], p[3])), MaxOp(), neg_inf<A>(), tpr);
    const A ml = m * log2e<A>();
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) p[k & 3] += m_exp2_ftz(fmaf(raw_get<T>(in[0][c], k), log2e<A>(), -ml));
    const A r = A(1) / row_allreduce<true>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A v[N];
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = m_exp2_ftz(fmaf(raw_get<T>(in[0][c], k), log2e<A>(), -ml)) * r;
        store_vals<ROW_FULL>(y + base, (c * tpr + t) * N, cols, v);
    }
}
