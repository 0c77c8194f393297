// PROTOTYPE: the FULL rows (16,384 bf16) of softmax_fwd_wide3: which of its differences from the fast rc prototype costs.
#include "softmax.cu"
template <bool V> struct BoolC { static constexpr bool value = V; };

template <class T, bool R, bool F, int C>
__device__ __forceinline__ void w3tail(Raw (&in)[1][C], T* __restrict__ y, long long base, int n, bool active,
                                       typename Elem<T>::acc m, int tpr, int t) {
    typedef typename Elem<T>::acc Ac;
    constexpr int N = Vec<T>::N;
    const Ac ml = m * log2e<Ac>();
    Ac q[4] = {Ac(0), Ac(0), Ac(0), Ac(0)};
    if (R) reconvert(in);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) q[k & 3] += softmax_e<F>(raw_get<T>(in[0][c], k), m, ml);
    const Ac r = Ac(1) / row_allreduce<true>((q[0] + q[1]) + (q[2] + q[3]), SumOp(), Ac(0), tpr);
    if (!active) return;
    if (R) reconvert(in);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        Ac v[N];
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = softmax_e<F>(raw_get<T>(in[0][c], k), m, ml) * r;
        store_vals<ROW_FULL>(y + base, (c * tpr + t) * N, n, v);
    }
}

// R: reconvert between passes; B: the |m| branch (else always the fma form); ACT: the active-row logic
template <class T, bool R, bool B, bool ACT>
__global__ void __launch_bounds__(512, 3) w3v(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    typedef typename Elem<T>::acc Ac;
    constexpr int N = Vec<T>::N, C = 4;
    const int tpr = blockDim.x, t = threadIdx.x;
    const long long row = blockIdx.x;
    const bool active = !ACT || row < rows;
    const int n = active ? cols : 0;
    const long long base = (active ? row : 0) * (long long)cols;
    Raw in[1][C];
    load_chunks<T, 1>({x + base}, in, n, true, tpr, t);
    Ac p[4] = {neg_inf<Ac>(), neg_inf<Ac>(), neg_inf<Ac>(), neg_inf<Ac>()};
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) p[k & 3] = m_max(p[k & 3], raw_get<T>(in[0][c], k));
    const Ac m = row_allreduce<true>(m_max(m_max(p[0], p[1]), m_max(p[2], p[3])), MaxOp(), neg_inf<Ac>(), tpr);
    if (!B || fabs(m) < Ac(1e38)) w3tail<T, R, true, C>(in, y, base, n, active, m, tpr, t);
    else w3tail<T, R, false, C>(in, y, base, n, active, m, tpr, t);
}
