// opsmith.ops fused residual add + RMSNorm (what a pre-norm transformer block does between its
// sublayers): s = x + residual, y = s * rstd * w, rstd = 1 / sqrt(mean(s^2) + eps). The kernel
// writes s (the new residual, rounded to T as the residual stream holds it) and y in one pass
// over x and residual, and saves rstd for the backward, which is rms_norm's on s.
//
// The register-row strategy of norm.cu (the row in registers, tpr threads a row); rows too long
// for it take norm_cluster.cu's add_rms_norm_fwd_cluster where rms_norm takes a cluster (sm_90+), else
// the caller runs an add and rms_norm (opsmith/ops/_fused.py).
// inf and NaN as rms_norm: a nonfinite element makes the row NaN.
//
// add_layer_norm_fwd* (the LayerNorm twin): s = x + residual rounded to T, then layer_norm's forward on s, in one
// pass over x and residual: norm_fwd.cuh's layer_norm_fwd_row with ADD, the register rows of layer_norm's plans
// (2 chunks a thread up to 16 KiB, 4 chunks on norm_c4_plan's rows); longer rows in whole aligned vectors take
// norm_l2.cu's add_layer_norm_fwd_l2, any other an add, then layer_norm.
#include "norm_fwd.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif

using namespace opsmith;

// One row of CC 16-byte chunks a thread, bounds checks as mode M (rows.cuh's RowMode): x, residual and the weight
// as loaded (zeros past the row's end), all read before the reduction; the row s = x + residual, rounded to T as
// the residual stream holds it, replaces x and is written before the reduction.
template <int M, class T, class A, int CC = OPSMITH_ROW_CHUNKS>
__device__ __forceinline__ void add_rms_norm_fwd_row(const T* __restrict__ x, const T* __restrict__ residual,
                                                     const T* __restrict__ w, T* __restrict__ y,
                                                     T* __restrict__ residual_out, A* __restrict__ rstd, long long rows,
                                                     int cols, A eps, int has_w) {
    OPSMITH_ROW_SETUP_C(CC)
    Raw in[3][C];
    load_chunks<T, 3>({x + base, residual + base, w}, in, n, M != ROW_SCALAR, tpr, t, has_w ? 7u : 3u);
    A p[4] = {A(0), A(0), A(0), A(0)};
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A s[N];
#pragma unroll
        for (int k = 0; k < N; ++k) s[k] = raw_get<T>(in[0][c], k) + raw_get<T>(in[1][c], k);
        in[0][c] = raw_pack<T>(s);  // rounded to T
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A v = raw_get<T>(in[0][c], k);
            p[k & 3] += v * v;
        }
        // idle rows: n = 0
        store_chunk<T>(residual_out + base, (long long)(c * tpr + t) * N, n, M != ROW_SCALAR, in[0][c]);
    }
    const A q = row_allreduce((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr);
    const A r = m_rsqrt(q / A(cols) + eps);
    if (active) {
        if (t == 0) rstd[row] = r;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = raw_get<T>(in[0][c], k) * r;
                o[k] = has_w ? v * raw_get<T>(in[2][c], k) : v;
            }
            store_vals<M>(y + base, (c * tpr + t) * N, n, o);
        }
    }
    // an inf in s, as rms_norm_fwd: s is read back from residual_out (this thread's own chunks)
    rms_inf_rows<T, C>(q, residual_out + base, y + base, rstd + (active ? row : 0), n, tpr);
}

template <class T, class A>
__device__ __noinline__ void add_rms_norm_fwd_scalar(const T* __restrict__ x, const T* __restrict__ residual,
                                                     const T* __restrict__ w, T* __restrict__ y,
                                                     T* __restrict__ residual_out, A* __restrict__ rstd,
                                                     long long rows, int cols, A eps, int has_w) {
    add_rms_norm_fwd_row<ROW_SCALAR>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
add_rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                 T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                 A eps, int has_w) {
    const bool vec = cols % Vec<T>::N == 0 && aligned16(x) && aligned16(residual) && aligned16(y) &&
                     aligned16(residual_out) && aligned16(w);
    const int mode = row_mode<T>(vec, cols);
    if (mode == ROW_FULL) add_rms_norm_fwd_row<ROW_FULL>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
    else if (mode == ROW_VEC)
        add_rms_norm_fwd_row<ROW_VEC>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
    else add_rms_norm_fwd_scalar(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}

// add_rms_norm_fwd's rows where every pointer is 16-byte aligned and cols fills the threads' chunks exactly (the
// caller's test: _launch.full_rows): the unchecked row alone, without the other modes' code. H100, L2 flushed
// (bench/diag_add_rms_full.py), bf16 GB/s: 512 x 1024 623 -> 643, 2048 x 2048 1,938 -> 1,982 (Liger-Kernel 672,
// 1,986), 4096 x 4096 2,656 -> 2,673.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
add_rms_norm_fwd_full(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                      T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                      A eps, int has_w) {
    add_rms_norm_fwd_row<ROW_FULL>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}

// The 8-chunk rows (_launch_norm.add_rms_c8_plan: rows of 16 to 64 KiB in whole 16-byte vectors of 2- and 4-byte
// types, every pointer 16-byte aligned), read once where the L2 rows (norm_l2.cu's add_rms_norm_fwd_l2) read them
// twice: up to OPSMITH_C8_THREADS threads (32 KiB) at 2 blocks an SM, OPSMITH_C8K_THREADS (64 KiB) at 1; 128
// registers, no spills (ptxas, sm_90). H100, kernels alone (bench/results/ops-c8-h100-2026-11-27/long1.json),
// GB/s L2 rows -> these: bf16 4096 x 16384 2,860 -> 2,950, 2048 x 32768 2,854 -> 2,927, 4096 x 32768 2,885 ->
// 2,978; float 8192 x 8192 2,883 -> 2,988 (Liger-Kernel 2,949-2,994 on the same shapes).
#define OPSMITH_C8_THREADS 256
#define OPSMITH_C8K_THREADS 512

template <class T, class A>
__device__ __forceinline__ void add_rms_norm_fwd_c8_any(const T* __restrict__ x, const T* __restrict__ residual,
                                                        const T* __restrict__ w, T* __restrict__ y,
                                                        T* __restrict__ residual_out, A* __restrict__ rstd,
                                                        long long rows, int cols, A eps, int has_w) {
    if (row_mode<T, 8>(true, cols) == ROW_FULL)
        add_rms_norm_fwd_row<ROW_FULL, T, A, 8>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
    else add_rms_norm_fwd_row<ROW_VEC, T, A, 8>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C8_THREADS, 2)
add_rms_norm_fwd_c8(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                    T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                    A eps, int has_w) {
    add_rms_norm_fwd_c8_any(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C8K_THREADS, 1)
add_rms_norm_fwd_c8k(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                     T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                     A eps, int has_w) {
    add_rms_norm_fwd_c8_any(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}

// -- add_layer_norm ---------------------------------------------------------------------------------------------
#define OPSMITH_ALN_C4_THREADS 256  // norm.cu's OPSMITH_C4_THREADS: norm_c4_plan's rows

template <class T, class A, int CC>
__device__ __noinline__ void add_layer_norm_fwd_scalar(const T* __restrict__ x, const T* __restrict__ residual,
                                                       const T* __restrict__ w, const T* __restrict__ b,
                                                       T* __restrict__ y, T* __restrict__ residual_out,
                                                       A* __restrict__ mean, A* __restrict__ rstd, long long rows,
                                                       int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_row<ROW_SCALAR, 1, T, A, CC, true>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b, residual,
                                                      residual_out);
}

// A row in the mode its launch allows (the element rows out of line, as layer_norm_fwd_any); w and b read after
// the reductions (LATE 1: only s lives through them)
template <class T, class A, int CC>
__device__ __forceinline__ void add_layer_norm_fwd_any(const T* __restrict__ x, const T* __restrict__ residual,
                                                       const T* __restrict__ w, const T* __restrict__ b,
                                                       T* __restrict__ y, T* __restrict__ residual_out,
                                                       A* __restrict__ mean, A* __restrict__ rstd, long long rows,
                                                       int cols, A eps, int has_w, int has_b) {
    const bool vec = cols % Vec<T>::N == 0 && aligned16(x) && aligned16(residual) && aligned16(y) &&
                     aligned16(residual_out) && aligned16(w) && aligned16(b);
    const int mode = row_mode<T, CC>(vec, cols);
    if (mode == ROW_FULL)
        layer_norm_fwd_row<ROW_FULL, 1, T, A, CC, true>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b,
                                                        residual, residual_out);
    else if (mode == ROW_VEC)
        layer_norm_fwd_row<ROW_VEC, 1, T, A, CC, true>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b,
                                                       residual, residual_out);
    else add_layer_norm_fwd_scalar<T, A, CC>(x, residual, w, b, y, residual_out, mean, rstd, rows, cols, eps, has_w,
                                             has_b);
}

// 2 chunks a thread: row_plan's register rows ("warp", "block": up to 16 KiB)
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
add_layer_norm_fwd(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                   const T* __restrict__ b, T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ mean,
                   A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    add_layer_norm_fwd_any<T, A, OPSMITH_ROW_CHUNKS>(x, residual, w, b, y, residual_out, mean, rstd, rows, cols, eps,
                                                     has_w, has_b);
}

// add_layer_norm_fwd's rows that fill their threads' 2 chunks, every pointer 16-byte aligned (_launch.full_rows;
// layer_norm_full2_plan's too): w and b loaded with x and residual, as layer_norm_fwd_full
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
add_layer_norm_fwd_full(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                        const T* __restrict__ b, T* __restrict__ y, T* __restrict__ residual_out,
                        A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                        int has_b) {
    layer_norm_fwd_row<ROW_FULL, 0, T, A, OPSMITH_ROW_CHUNKS, true>(x, w, b, y, mean, rstd, rows, cols, eps, has_w,
                                                                    has_b, residual, residual_out);
}

// 4 chunks a thread, as layer_norm_fwd_c4 (norm_c4_plan's rows: 2 to 16 KiB in whole 16-byte vectors)
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ALN_C4_THREADS, (RowBlocks<T, 3, 3>::value))
add_layer_norm_fwd_c4(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                      const T* __restrict__ b, T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ mean,
                      A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    add_layer_norm_fwd_any<T, A, 4>(x, residual, w, b, y, residual_out, mean, rstd, rows, cols, eps, has_w, has_b);
}

// add_layer_norm_fwd_c4's rows that fill their threads' 4 chunks, every pointer 16-byte aligned: w and b a chunk at
// a time in the output loop, as layer_norm_fwd_c4_full
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ALN_C4_THREADS, (RowBlocks<T, 3, 3>::value))
add_layer_norm_fwd_c4_full(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                           const T* __restrict__ b, T* __restrict__ y, T* __restrict__ residual_out,
                           A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                           int has_b) {
    layer_norm_fwd_row<ROW_FULL, 2, T, A, 4, true>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b, residual,
                                                   residual_out);
}
