// opsmith.ops: the rows of the register-row norm forwards (norm.cu's layer_norm_fwd*, rms_norm_fwd*): a
// row of `cols` elements held in registers, C chunks of 16 bytes a thread (OPSMITH_ROW_CHUNKS, or 4 for
// the *_c4 kernels), tpr = blockDim.x threads a row, blockDim.y rows a block. norm.cu says what the
// norms compute and how; rows.cuh holds what these rows share with the other register-row kernels.
#pragma once
#include "rows.cuh"

namespace opsmith {

// One row of layer_norm's register forward, bounds checks as mode M (rows.cuh's RowMode), sums in 4
// partials a thread (chains of 4, not C * N). w and b are loaded with x (LATE = 0), after the
// reductions (1: only x lives through them, which lets layer_norm_fwd_wide hold 3 blocks an SM), or a
// chunk at a time in the output loop (2, ROW_FULL only: 56 registers at 4 chunks where 1 holds 80;
// layer_norm_fwd_c4_full). ADD (fused_norm.cu's add_layer_norm_fwd*): the row is x + res, rounded to T as the
// residual stream holds it and written to res_out before the reductions (x and res both read first).
template <int M, int LATE, class T, class A, int CC = OPSMITH_ROW_CHUNKS, bool ADD = false>
__device__ __forceinline__ void layer_norm_fwd_row(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, T* __restrict__ y, A* __restrict__ mean,
                                                   A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                                                   int has_b, const T* __restrict__ res = nullptr,
                                                   T* __restrict__ res_out = nullptr) {
    static_assert(LATE != 2 || M == ROW_FULL, "LATE = 2 reads w and b unchecked");
    OPSMITH_ROW_SETUP_C(CC)
    Raw in[ADD ? 2 : 1][C], wb[2][LATE == 2 ? 1 : C];  // x (and res), w, b as loaded (zeros past the row's end)
    const unsigned on = (has_w ? 1u : 0u) | (has_b ? 2u : 0u);
    if constexpr (ADD) {
        load_chunks<T, 2>({x + base, res + base}, in, n, M != ROW_SCALAR, tpr, t);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A s[N];
#pragma unroll
            for (int k = 0; k < N; ++k) s[k] = OPSMITH_E(in[0], c, k) + OPSMITH_E(in[1], c, k);
            in[0][c] = raw_pack<T>(s);  // rounded to T; idle rows: n = 0, nothing stored
            store_chunk<T>(res_out + base, (long long)(c * tpr + t) * N, n, M != ROW_SCALAR, in[0][c]);
        }
    } else {
        load_chunks<T, 1>({x + base}, in, n, M != ROW_SCALAR, tpr, t);
    }
    if constexpr (LATE == 0) load_chunks<T, 2>({w, b}, wb, n, M != ROW_SCALAR, tpr, t, on);
    A p[4] = {A(0), A(0), A(0), A(0)};
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) p[k & 3] += OPSMITH_E(in[0], c, k);
    const A mu = row_allreduce<(C >= 4)>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr) / A(cols);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int j = (c * tpr + t) * N;
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A d = in_row<M>(j, k, n) ? OPSMITH_E(in[0], c, k) - mu : A(0);
            p[k & 3] += d * d;
        }
    }
    const A r = m_rsqrt(row_allreduce<(C >= 4)>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr) / A(cols) + eps);
    if (!active) return;  // no reduction follows
    if constexpr (LATE == 1) load_chunks<T, 2>({w, b}, wb, n, M != ROW_SCALAR, tpr, t, on);
    if (t == 0) {
        mean[row] = mu;
        rstd[row] = r;
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int cw = LATE == 2 ? 0 : c;  // w and b's chunk: chunk c, loaded here when LATE = 2
        if constexpr (LATE == 2) {  // ROW_FULL, active rows only: no bounds
            const int j = (c * tpr + t) * N;
            wb[0][0] = wb[1][0] = Raw{{0u, 0u, 0u, 0u}};
            if (has_w) wb[0][0] = *reinterpret_cast<const Raw*>(w + j);
            if (has_b) wb[1][0] = *reinterpret_cast<const Raw*>(b + j);
        }
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            o[k] = (OPSMITH_E(in[0], c, k) - mu) * r;
            if (has_w) o[k] *= OPSMITH_E(wb[0], cw, k);
            if (has_b) o[k] += OPSMITH_E(wb[1], cw, k);
        }
        store_vals<M>(y + base, (c * tpr + t) * N, n, o);
    }
}

template <class T, class A, int CC>
__device__ __noinline__ void layer_norm_fwd_scalar(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, T* __restrict__ y, A* __restrict__ mean,
                                                   A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                                                   int has_b) {
    layer_norm_fwd_row<ROW_SCALAR, 0, T, A, CC>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// A row in the mode its launch allows; the element-wise rows (unaligned or odd widths) run out of
// line (`__noinline__`), so that their registers do not weigh on the vector paths (softmax_fwd's
// bf16 spilled with all three inline).
template <int LATE, class T, class A, int CC = OPSMITH_ROW_CHUNKS>
__device__ __forceinline__ void layer_norm_fwd_any(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, T* __restrict__ y, A* __restrict__ mean,
                                                   A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                                                   int has_b) {
    const bool vec = cols % Vec<T>::N == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b);
    const int mode = row_mode<T, CC>(vec, cols);
    if (mode == ROW_FULL)
        layer_norm_fwd_row<ROW_FULL, LATE, T, A, CC>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
    else if (mode == ROW_VEC)
        layer_norm_fwd_row<ROW_VEC, LATE, T, A, CC>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
    else layer_norm_fwd_scalar<T, A, CC>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// One row of rms_norm's register forward, bounds checks as mode M, the sum of squares in 2 partials;
// an inf in the row is looked for after the row is written, where the sum is inf (rms_inf_rows).
template <int M, class T, class A, int CC = OPSMITH_ROW_CHUNKS>
__device__ __forceinline__ void rms_norm_fwd_row(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                                 A* __restrict__ rstd, long long rows, int cols, A eps, int has_w) {
    OPSMITH_ROW_SETUP_C(CC)
    Raw in[2][C];  // x and w as loaded (zeros past the row's end), both read before the reduction
    load_chunks<T, 2>({x + base, w}, in, n, M != ROW_SCALAR, tpr, t, has_w ? 3u : 1u);
    A p[2] = {A(0), A(0)};
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A v = OPSMITH_E(in[0], c, k);
            p[k & 1] += v * v;
        }
    const A q = row_allreduce<(C >= 4)>(p[0] + p[1], SumOp(), A(0), tpr);
    const A r = m_rsqrt(q / A(cols) + eps);
    if (active) {
        if (t == 0) rstd[row] = r;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = OPSMITH_E(in[0], c, k);
                o[k] = has_w ? v * r * OPSMITH_E(in[1], c, k) : v * r;
            }
            store_vals<M>(y + base, (c * tpr + t) * N, n, o);
        }
    }
    rms_inf_rows<T, C>(q, x + base, y + base, rstd + (active ? row : 0), n, tpr);
}

template <class T, class A, int CC>
__device__ __noinline__ void rms_norm_fwd_scalar(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                                 A* __restrict__ rstd, long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_row<ROW_SCALAR, T, A, CC>(x, w, y, rstd, rows, cols, eps, has_w);
}

// rms_norm's row in the mode its launch allows (the element rows out of line, as layer_norm_fwd_any)
template <class T, class A, int CC = OPSMITH_ROW_CHUNKS>
__device__ __forceinline__ void rms_norm_fwd_any(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                                 A* __restrict__ rstd, long long rows, int cols, A eps, int has_w) {
    const int mode = row_mode<T, CC>(cols % Vec<T>::N == 0 && aligned16(x) && aligned16(y) && aligned16(w), cols);
    if (mode == ROW_FULL) rms_norm_fwd_row<ROW_FULL, T, A, CC>(x, w, y, rstd, rows, cols, eps, has_w);
    else if (mode == ROW_VEC) rms_norm_fwd_row<ROW_VEC, T, A, CC>(x, w, y, rstd, rows, cols, eps, has_w);
    else rms_norm_fwd_scalar<T, A, CC>(x, w, y, rstd, rows, cols, eps, has_w);
}

}  // namespace opsmith
