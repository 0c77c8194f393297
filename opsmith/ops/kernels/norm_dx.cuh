// opsmith.ops LayerNorm and RMSNorm backwards: grad_x alone, a row a row lane of block `blk` (the "split"
// kernels of norm_split.cu and the "small" ones of norm_small.cu). The math is norm.cu's.
#pragma once
#include "rows.cuh"

namespace opsmith {

// The weight gradient grad_y * xhat (xhat = (x - mu) * r, or x * r without `centred`) and the bias
// gradient grad_y of the launch's one row, from its chunks as loaded (in[0] grad_y, in[1] x)
template <class T, class A, int C>
__device__ __forceinline__ void one_row_weights(const Raw (&in)[3][C], A mu, A r, bool centred, T* grad_w, T* grad_b,
                                                int want_w, int want_b, int n, bool vec, int tpr, int t) {
    constexpr int N = Vec<T>::N;
    vec = vec && (!want_w || aligned16(grad_w)) && (!want_b || aligned16(grad_b));
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A ow[N], ob[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            ob[k] = raw_get<T>(in[0][c], k);
            ow[k] = ob[k] * ((centred ? raw_get<T>(in[1][c], k) - mu : raw_get<T>(in[1][c], k)) * r);
        }
        const long long j = (long long)(c * tpr + t) * N;
        if (want_w) store_vec(grad_w, j, n, vec, ow);
        if (want_b) store_vec(grad_b, j, n, vec, ob);
    }
}

// layer_norm's grad_x of block `blk`'s rows; one_w / one_b: a launch of one row writes its weight and bias
// gradients too (layer_norm_bwd_dx)
template <class T, class A>
__device__ __forceinline__ void layer_norm_dx_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                   const T* __restrict__ w, const A* __restrict__ mean,
                                                   const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows,
                                                   int cols, int has_w, T* __restrict__ grad_w, T* __restrict__ grad_b,
                                                   int one_w, int one_b, unsigned blk) {
    OPSMITH_ROW_SETUP_AT(OPSMITH_ROW_CHUNKS, blk)
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
    Raw in[3][C];  // grad_y, x and w as loaded (zeros past the row's end)
    load_chunks<T, 3>({grad_y + base, x + base, w}, in, n, vec, tpr, t, has_w ? 7u : 3u);
    const A mu = active ? mean[row] : A(0), r = active ? rstd[row] : A(0);
    A s1 = A(0), s2 = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A g = OPSMITH_E(in[0], c, k), xh = (OPSMITH_E(in[1], c, k) - mu) * r;
            const A gw = has_w ? g * OPSMITH_E(in[2], c, k) : g;
            s1 += gw;
            s2 += gw * xh;
        }
    row_allreduce_sum2(s1, s2, tpr);
    s1 /= A(cols);
    s2 /= A(cols);
    if (!active) return;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A g = OPSMITH_E(in[0], c, k), xh = (OPSMITH_E(in[1], c, k) - mu) * r;
            o[k] = r * ((has_w ? g * OPSMITH_E(in[2], c, k) : g) - s1 - xh * s2);
        }
        store_vec(grad_x + base, OPSMITH_J(c), n, vec, o);
    }
    if ((one_w | one_b) && rows == 1)
        one_row_weights<T, A, C>(in, mu, r, true, grad_w, grad_b, one_w, one_b, n, vec, tpr, t);
}

// rms_norm's grad_x of block `blk`'s rows; grad_res (add_rms_norm's, has_res): the gradient that reached the
// new residual, added to grad_x; one_w: as layer_norm_dx_rows
template <class T, class A>
__device__ __forceinline__ void rms_norm_dx_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                 const T* __restrict__ w, const A* __restrict__ rstd,
                                                 T* __restrict__ grad_x, long long rows, int cols, int has_w,
                                                 const T* __restrict__ grad_res, int has_res, T* __restrict__ grad_w,
                                                 int one_w, unsigned blk) {
    OPSMITH_ROW_SETUP_AT(OPSMITH_ROW_CHUNKS, blk)
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x) &&
                     (!has_res || aligned16(grad_res));
    Raw in[3][C];  // grad_y, x and w as loaded
    load_chunks<T, 3>({grad_y + base, x + base, w}, in, n, vec, tpr, t, has_w ? 7u : 3u);
    const A r = active ? rstd[row] : A(0);
    A d = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A g = OPSMITH_E(in[0], c, k);
            d += (has_w ? g * OPSMITH_E(in[2], c, k) : g) * OPSMITH_E(in[1], c, k);
        }
    d = row_allreduce(d, SumOp(), A(0), tpr) / A(cols);
    if (!active) return;
    Raw res[1][C];
    load_chunks<T, 1>({grad_res + base}, res, n, vec, tpr, t, has_res ? 1u : 0u);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A g = OPSMITH_E(in[0], c, k), v = OPSMITH_E(in[1], c, k);
            o[k] = r * ((has_w ? g * OPSMITH_E(in[2], c, k) : g) - v * r * r * d);
            if (has_res) o[k] += OPSMITH_E(res[0], c, k);
        }
        store_vec(grad_x + base, OPSMITH_J(c), n, vec, o);
    }
    if (one_w && rows == 1) one_row_weights<T, A, C>(in, A(0), r, false, grad_w, grad_w, 1, 0, n, vec, tpr, t);
}

}  // namespace opsmith
