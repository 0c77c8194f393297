// opsmith.ops softmax's backward rows, grad_x = y * (grad_y - sum(grad_y * y)): the register rows of C chunks a
// thread (softmax_bwd, softmax_bwd_wide) and the rows that stage grad_y in shared memory (softmax_bwd_wide_sm).
// The kernels are softmax.cu's.
#pragma once
#include "rows.cuh"

namespace opsmith {

// The register backward's row, C chunks a thread, bounds checks as mode M (rows.cuh's RowMode, as the
// forward's: compiled once per mode, the element path out of line; with one runtime `vec` path the wide
// kernel spilled at 64 registers).
template <int M, int C, class T>
__device__ __forceinline__ void softmax_bwd_row(const T* __restrict__ grad_y, const T* __restrict__ y,
                                                T* __restrict__ grad_x, long long rows, int cols) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    const long long row = blockIdx.x * (long long)blockDim.y + threadIdx.y;
    const bool active = row < rows;
    const int n = active ? cols : 0;
    const long long base = (active ? bwd_row(row, rows) : 0) * (long long)cols;
    Raw in[2][C];  // grad_y and y as loaded (zeros past the row's end)
    load_chunks<T, 2>({grad_y + base, y + base}, in, n, M != ROW_SCALAR, tpr, t);
    A p[4] = {A(0), A(0), A(0), A(0)};  // 4 chains instead of C * N
#pragma unroll
    for (int i = 0; i < C * N; ++i) p[i & 3] += raw_get<T>(in[0][i / N], i % N) * raw_get<T>(in[1][i / N], i % N);
    const A dot = row_allreduce((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr);
    reconvert(in);  // the chunks as loaded are all that stays live across the reduction
    if (active) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A g[N];
#pragma unroll
            for (int k = 0; k < N; ++k) g[k] = raw_get<T>(in[1][c], k) * (raw_get<T>(in[0][c], k) - dot);
            store_vals<M>(grad_x + base, (c * tpr + t) * N, n, g);
        }
    }
}

// the checked rows (odd widths, element access) out of line: inlined beside the unchecked one, the bf16 wide
// kernel spilled (84-164 bytes at 64 registers; ptxas), the unchecked row alone does not
template <int M, int C, class T>
__device__ __noinline__ void softmax_bwd_checked(const T* __restrict__ grad_y, const T* __restrict__ y,
                                                 T* __restrict__ grad_x, long long rows, int cols) {
    softmax_bwd_row<M, C>(grad_y, y, grad_x, rows, cols);
}

template <int C, class T>
__device__ __forceinline__ void softmax_bwd_any(const T* __restrict__ grad_y, const T* __restrict__ y,
                                                T* __restrict__ grad_x, long long rows, int cols) {
    const int mode = row_mode<T, C>(cols % Vec<T>::N == 0 && aligned16(grad_y) && aligned16(y) && aligned16(grad_x),
                                    cols);
    if (mode == ROW_FULL) softmax_bwd_row<ROW_FULL, C>(grad_y, y, grad_x, rows, cols);
    else if (mode == ROW_VEC) softmax_bwd_checked<ROW_VEC, C>(grad_y, y, grad_x, rows, cols);
    else softmax_bwd_checked<ROW_SCALAR, C>(grad_y, y, grad_x, rows, cols);
}

// The backward of a row that fills C chunks a thread of one block, grad_y staged in dynamic shared memory
// (C * blockDim.x * 16 bytes): cp.async copies it there without registers (sm_80+), so that only y is held in
// registers, where softmax_bwd_wide<float, 8> holds both (64 values a thread at 1,024 threads: 100 bytes of
// spills on sm_90). A thread reads back only the chunks it staged itself: no barrier needed for them.
template <int C, class T>
__device__ __forceinline__ void softmax_bwd_row_staged(const T* __restrict__ grad_y, const T* __restrict__ y,
                                                       T* __restrict__ grad_x, long long rows, int cols) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    const long long base = bwd_row(blockIdx.x, rows) * (long long)cols;
    Raw* stage = reinterpret_cast<Raw*>(opsmith_dyn_smem);
    const Raw* gs = reinterpret_cast<const Raw*>(grad_y + base);
    const Raw* ys = reinterpret_cast<const Raw*>(y + base);
#pragma unroll
    for (int c = 0; c < C; ++c) cp_async16(stage + c * tpr + t, gs + c * tpr + t);
    Raw yv[C];
#pragma unroll
    for (int c = 0; c < C; ++c) yv[c] = ys[c * tpr + t];
    cp_async_wait_all();
    A p[4] = {A(0), A(0), A(0), A(0)};
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const Raw g = stage[c * tpr + t];
#pragma unroll
        for (int k = 0; k < N; ++k) p[(c * N + k) & 3] += raw_get<T>(g, k) * raw_get<T>(yv[c], k);
    }
    const A dot = row_allreduce((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const Raw g = stage[c * tpr + t];
        A out[N];
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = raw_get<T>(yv[c], k) * (raw_get<T>(g, k) - dot);
        store_vals<ROW_FULL>(grad_x + base, (c * tpr + t) * N, cols, out);
    }
}

}  // namespace opsmith
