// opsmith.ops: what the register-row kernels (softmax.cu, norm.cu, fused_norm.cu) share beyond
// common.cuh: their register caps, bounds checks by mode, stores, rms_norm's inf check, setup.
#pragma once
#include "common.cuh"

namespace opsmith {

// The minimum blocks of OPSMITH_ROW_THREADS (512) threads an SM must hold at once for a register-row
// kernel, by element size (`__launch_bounds__`' second argument: the registers a thread may use,
// 128 / 64 / 42 / 32 for 1 / 2 / 3 / 4). Measured per kernel on an H200 with bench/diag_row_fwd.py
// (bench/results/ops-bwd-h200-2026-11-26/fwd.json): the forwards' default of 58-60 registers held
// 1,024 threads an SM, too few loads in flight for its bandwidth; 3 gave rms_norm_fwd (bf16) +25 % at
// 8192 x 8192, while layer_norm_fwd spills at 3. 8-byte types keep 1 (correct, not tuned).
template <class T, int B16, int B32>
struct RowBlocks {
    static constexpr int value = sizeof(T) == 8 ? 1 : sizeof(T) == 4 ? B32 : B16;
};

// -- the register-row forwards: bounds checks by what the launch guarantees ---------------------
// ROW_FULL: 16-byte access and every chunk of every thread inside the row (cols == C * N * tpr, the
// power-of-two widths): no check at all; ROW_VEC: 16-byte access, a chunk wholly inside the row or
// wholly past its end: one check a chunk; ROW_SCALAR: element access, one check an element. The
// kernels compile their row once per mode and pick one at run time: the checks of ROW_SCALAR on
// every element (64-bit compares and selects) were most of the forwards' instructions at 16-bit
// widths, where an SM must finish about 4 elements a cycle to keep up with HBM.
enum RowMode { ROW_SCALAR = 0, ROW_VEC = 1, ROW_FULL = 2 };

// element k of the chunk starting at column j is inside a row of n elements
template <int M> __device__ __forceinline__ bool in_row(int j, int k, int n) {
    return M == ROW_FULL ? true : M == ROW_VEC ? j < n : j + k < n;
}

// N values to elements j .. j+N-1 of a row of n, rounded to T (checks as in_row<M>; ROW_FULL
// checks nothing: the caller stores active rows only)
template <int M, class T, class A> __device__ __forceinline__ void store_vals(T* row, int j, int n, const A* in) {
    constexpr int N = Vec<T>::N;
    if (M != ROW_SCALAR) {
        if (M == ROW_FULL || j < n) *reinterpret_cast<Raw*>(row + j) = raw_pack<T>(in);
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (j + k < n) row[j + k] = Elem<T>::store(in[k]);
    }
}

// the mode of this launch's rows: vec = 16-byte access allowed (cols % N == 0, pointers aligned)
template <class T, int C = OPSMITH_ROW_CHUNKS> __device__ __forceinline__ int row_mode(bool vec, int cols) {
    return !vec ? ROW_SCALAR : cols == C * Vec<T>::N * (int)blockDim.x ? ROW_FULL : ROW_VEC;
}

// a 16-byte chunk of T holds an inf or a NaN (on the bits: a conversion to float per element would
// be shared with the caller's later use of the same elements and keep them all live)
template <class T> __device__ __forceinline__ bool raw_nonfinite(const Raw& r) {
    bool any = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned u = r.u[i];
        if constexpr (sizeof(T) == 2) {
            const unsigned e = sizeof(T) == 2 && Elem<T>::is_bf16 ? 0x7f80u : 0x7c00u;  // exponent all ones
            any |= (u & 0x7fffu) >= e || ((u >> 16) & 0x7fffu) >= e;
        } else if constexpr (sizeof(T) == 4) {
            any |= (u & 0x7fffffffu) >= 0x7f800000u;
        } else if (i & 1) {
            any |= (u & 0x7fffffffu) >= 0x7ff00000u;  // the high word of a double
        }
    }
    return any;
}

// rms_norm's sum of squares q of a row (every thread of the row holds it) is +inf when a square
// overflowed or when the row holds an inf; the row must be NaN in the second case only (as an inf
// or NaN makes every norm's row NaN; a NaN makes q NaN by itself). Called after the row's y and
// rstd were written from q (rstd 0, y 0 or NaN), so that nothing of the row stays live for it: where
// q is inf somewhere in the warp (tpr <= 32: several rows a warp, every lane takes part in the
// shuffles) or in the block's one row, this thread's chunks of x (`xr`: the row, n elements; 0:
// an idle row) are read again, and a row holding an inf is overwritten with NaN, rstd too.
template <class T>
__device__ __forceinline__ void rms_inf_rows(typename Elem<T>::acc q, const T* __restrict__ xr, T* __restrict__ yr,
                                             typename Elem<T>::acc* rstd_row, int n, int tpr) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const bool inf = q == pos_inf<A>();
    if (!(tpr <= 32 ? __any_sync(0xffffffffu, inf) : inf)) return;
    const int t = threadIdx.x;
    int any = 0;
    for (int c = 0; c < OPSMITH_ROW_CHUNKS; ++c)
        for (int k = 0; k < N; ++k) {
            const int j = (c * tpr + t) * N + k;
            if (j < n) {
                Raw r = {{0u, 0u, 0u, 0u}};
                raw_put<T>(r, 0, xr[j]);
                any |= raw_nonfinite<T>(r) ? 1 : 0;
            }
        }
    if (tpr > 32) {
        any = __syncthreads_or(any);  // one row a block
    } else {
        for (int o = tpr >> 1; o > 0; o >>= 1) any |= __shfl_xor_sync(0xffffffffu, any, o);
    }
    if (!any || !inf) return;
    const A nan = nonfinite(q);  // inf - inf
    for (int c = 0; c < OPSMITH_ROW_CHUNKS; ++c)
        for (int k = 0; k < N; ++k) {
            const int j = (c * tpr + t) * N + k;
            if (j < n) yr[j] = Elem<T>::store(nan);
        }
    if (t == 0) *rstd_row = nan;
}

// chunk `c` of a thread's register row back to memory (as load_chunks: wholly or not at all when vec)
template <class T>
__device__ __forceinline__ void store_chunk(T* row, long long j, long long n, bool vec, const Raw& in) {
    constexpr int N = Vec<T>::N;
    if (vec) {
        if (j < n) *reinterpret_cast<Raw*>(row + j) = in;
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (j + k < n) row[j + k] = raw_elem<T>(in, k);
    }
}

}  // namespace opsmith

// The register-row kernels' setup (norm.cu, fused_norm.cu): a block of blockDim.y rows, tpr =
// blockDim.x threads a row, C chunks of N elements per thread.
#define OPSMITH_ROW_SETUP                                                          \
    typedef typename Elem<T>::acc A_;                                              \
    constexpr int N = Vec<T>::N, C = OPSMITH_ROW_CHUNKS;                           \
    const int tpr = blockDim.x, t = threadIdx.x;                                   \
    const long long row = blockIdx.x * (long long)blockDim.y + threadIdx.y;        \
    const bool active = row < rows; /* idle rows still take part in reductions */  \
    const int n = active ? cols : 0;                                               \
    const long long base = (active ? row : 0) * (long long)cols;

// element i of a thread's register row (chunk i / N, lane i % N) is column col(i)
#define OPSMITH_COL(i) ((long long)(((i) / N) * tpr + t) * N + (i) % N)
