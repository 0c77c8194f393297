// opsmith.ops LayerNorm and RMSNorm backwards of few rows in one launch (_launch_bwd.norm_bwd_small_plan's "small"):
// the first ceil(rows / blockDim.y) blocks write grad_x, a row a row lane (norm_dx.cuh, as the "split"
// kernels); the rest add up the weight (and bias) gradients over every row, `lanes` column lanes of a
// 16-byte vector each by 256 / lanes row lanes a block, and round them straight to the gradients. The two
// kinds of block read grad and x each (the input twice, from L2 the second time where they run together)
// but nothing else: no partial sums written and read back, and no second launch. At these sizes a launch
// and a round trip to memory are most of the time: the persistent backward and norm_col_sum took 4.5-6.5
// us of kernels at 64 rows on an H100, eager's two kernels 3.2-4.1
// (bench/results/ops-h100-2026-11-27/small-bwd.json). In one launch, bf16, GPU time a call with the L2 flushed:
// layer_norm 64 x 1024 11.42 -> 7.55 us (eager 9.50), 1024 x 1024 16.77 -> 12.24 (eager 15.39); from 2,048 rows
// its weight blocks take too many rows each and it lost (bench/results/ops-small-bwd-h100-2026-11-27/).
//
// Kernels: layer_norm_bwd_small<T, A>(grad_y, x, w, mean, rstd, grad_x, grad_w, grad_b, rows, cols, has_w,
//          want_w, want_b, lanes), rms_norm_bwd_small<T, A>(grad_y, x, w, rstd, grad_x, grad_w, rows, cols,
//          has_w, want_w, grad_res, has_res, lanes); blocks of OPSMITH_SMALL_THREADS threads (tpr x rows).
#include "norm_dx.cuh"

#ifndef OPSMITH_SMALL_THREADS
#define OPSMITH_SMALL_THREADS 256  // NORM_BWD_BLOCK in opsmith/ops/_launch.py
#endif

using namespace opsmith;

namespace {

// Column block `cb` of the weight gradient grad_y * xhat (xhat = (x - mean) * rstd, or x * rstd without
// has_mean) and the bias gradient grad_y, summed over every row: `lanes` column lanes of N columns each (W
// columns a block) by B / lanes row lanes, four rows' loads in flight; then each column's B / lanes sums in a
// fixed order (deterministic), B / W threads a column of N sums each and shuffles.
template <class T, class A>
__device__ __forceinline__ void weight_cols(const T* __restrict__ grad_y, const T* __restrict__ x,
                                            const A* __restrict__ mean, const A* __restrict__ rstd,
                                            T* __restrict__ dw_out, T* __restrict__ db_out, long long rows, int cols,
                                            int has_mean, int want_w, int want_b, unsigned cb, int lanes) {
    constexpr int N = Vec<T>::N, B = OPSMITH_SMALL_THREADS;
    __shared__ A sw[B * N], sb[B * N];  // [row lane][k * lanes + lane]
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int lane = tid % lanes, rl = tid / lanes, rls = B / lanes, W = lanes * N;
    const long long first = (long long)cb * W, c0 = first + (long long)lane * N;
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x);
    A dw[N], db[N];
#pragma unroll
    for (int k = 0; k < N; ++k) dw[k] = db[k] = A(0);
    long long r = rl;
    if (vec && c0 < cols) {
        for (; r + 3 * rls < rows; r += 4 * rls) {
            Raw gr[4], xr[4];
            A mu[4], rs[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const long long ru = r + (long long)u * rls;
                gr[u] = *reinterpret_cast<const Raw*>(grad_y + ru * cols + c0);
                xr[u] = *reinterpret_cast<const Raw*>(x + ru * cols + c0);
                mu[u] = has_mean ? mean[ru] : A(0);
                rs[u] = rstd[ru];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = raw_get<T>(gr[u], k);
                    dw[k] += g * ((raw_get<T>(xr[u], k) - mu[u]) * rs[u]);
                    db[k] += g;
                }
        }
    }
    if (c0 < cols) {
        for (; r < rows; r += rls) {  // the rest (and rows that allow no 16-byte access)
            A g[N], v[N];
            load_vec(grad_y + r * cols, c0, cols, vec, g, A(0));
            load_vec(x + r * cols, c0, cols, vec, v, A(0));
            const A mu = has_mean ? mean[r] : A(0), rs = rstd[r];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                dw[k] += g[k] * ((v[k] - mu) * rs);
                db[k] += g[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
        sw[rl * W + k * lanes + lane] = dw[k];
        sb[rl * W + k * lanes + lane] = db[k];
    }
    __syncthreads();
    const int tpc = B / W, i = tid / tpc, j = tid % tpc, s = (i % N) * lanes + i / N;  // column i: lane i / N
    A a = A(0), b = A(0);
    for (int l = j; l < rls; l += tpc) {
        a += sw[l * W + s];
        b += sb[l * W + s];
    }
    for (int o = tpc >> 1; o > 0; o >>= 1) {  // tpc <= 32 (the plan keeps W >= 8): within a warp
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (j == 0 && first + i < cols) {
        if (want_w) dw_out[first + i] = Elem<T>::store(a);
        if (want_b) db_out[first + i] = Elem<T>::store(b);
    }
}

}  // namespace

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_SMALL_THREADS)
layer_norm_bwd_small(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                     const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                     T* __restrict__ grad_w, T* __restrict__ grad_b, long long rows, int cols, int has_w, int want_w,
                     int want_b, int lanes) {
    if (blockDim.x * blockDim.y != OPSMITH_SMALL_THREADS) __trap();  // a plan this kernel does not hold
    const long long dx_blocks = (rows + blockDim.y - 1) / blockDim.y;
    if (blockIdx.x < dx_blocks)
        layer_norm_dx_rows<T, A>(grad_y, x, w, mean, rstd, grad_x, rows, cols, has_w, grad_w, grad_b, 0, 0,
                                 blockIdx.x);
    else if (want_w | want_b)
        weight_cols<T, A>(grad_y, x, mean, rstd, grad_w, grad_b, rows, cols, 1, want_w, want_b,
                          (unsigned)(blockIdx.x - dx_blocks), lanes);
}

// grad_res (add_rms_norm's, has_res): the gradient that reached the new residual, added to grad_x
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_SMALL_THREADS)
rms_norm_bwd_small(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                   const A* __restrict__ rstd, T* __restrict__ grad_x, T* __restrict__ grad_w, long long rows, int cols,
                   int has_w, int want_w, const T* __restrict__ grad_res, int has_res, int lanes) {
    if (blockDim.x * blockDim.y != OPSMITH_SMALL_THREADS) __trap();
    const long long dx_blocks = (rows + blockDim.y - 1) / blockDim.y;
    if (blockIdx.x < dx_blocks)
        rms_norm_dx_rows<T, A>(grad_y, x, w, rstd, grad_x, rows, cols, has_w, grad_res, has_res, grad_w, 0,
                               blockIdx.x);
    else if (want_w)
        weight_cols<T, A>(grad_y, x, rstd, rstd, grad_w, grad_w, rows, cols, 0, 1, 0,
                          (unsigned)(blockIdx.x - dx_blocks), lanes);
}
