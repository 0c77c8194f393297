// opsmith.ops LayerNorm and RMSNorm backwards for few rows (the "split" plans of
// _launch.norm_bwd_plan): grad_x alone, one row a row lane and a block a few rows, every row at
// once; the weight and bias gradients then come from norm_bwd_weight (norm_long.cu) over grad and
// x again. norm.cu's persistent backwards add those inside the kernel, but each of their blocks writes a row of
// partial sums: with few rows a block that costs more than reading the input
// twice, and their 128 registers a thread (two rows in flight) hold an SM to 512 threads, where
// these kernels' 64 hold it to 1024 (bench/diag_norm_split.py). The math is norm.cu's.
#include "rows.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
// blocks of OPSMITH_ROW_THREADS an SM holds at once in these kernels (up to 64 registers a thread)
#ifndef OPSMITH_DX_BLOCKS
#define OPSMITH_DX_BLOCKS 2
#endif

using namespace opsmith;

#define OPSMITH_DX_SETUP                                                                            \
    constexpr int N = Vec<T>::N, C = OPSMITH_ROW_CHUNKS;                                            \
    const int tpr = blockDim.x, t = threadIdx.x;                                                    \
    const long long row = blockIdx.x * (long long)blockDim.y + threadIdx.y;                         \
    const bool active = row < rows; /* idle rows still take part in the reductions */               \
    const long long n = active ? cols : 0, base = (active ? row : 0) * (long long)cols;
#define OPSMITH_DX_J(c) ((long long)((c) * tpr + t) * N)
#define OPSMITH_DX_E(a, c, k) raw_get<T>((a)[c], k)

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_DX_BLOCKS)
layer_norm_bwd_dx(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                  const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows,
                  int cols, int has_w) {
    OPSMITH_DX_SETUP
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
    Raw in[3][C];  // grad_y, x and w as loaded (zeros past the row's end)
    load_chunks<T, 3>({grad_y + base, x + base, w}, in, n, vec, tpr, t, has_w ? 7u : 3u);
    const A mu = active ? mean[row] : A(0), r = active ? rstd[row] : A(0);
    A s1 = A(0), s2 = A(0);
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A g = OPSMITH_DX_E(in[0], c, k), xh = (OPSMITH_DX_E(in[1], c, k) - mu) * r;
            const A gw = has_w ? g * OPSMITH_DX_E(in[2], c, k) : g;
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
            const A g = OPSMITH_DX_E(in[0], c, k), xh = (OPSMITH_DX_E(in[1], c, k) - mu) * r;
            o[k] = r * ((has_w ? g * OPSMITH_DX_E(in[2], c, k) : g) - s1 - xh * s2);
        }
        store_vec(grad_x + base, OPSMITH_DX_J(c), n, vec, o);
    }
}

// grad_res (add_rms_norm's, has_res): the gradient that reached the new residual, added to grad_x
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_DX_BLOCKS)
rms_norm_bwd_dx(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows, int cols, int has_w,
                const T* __restrict__ grad_res, int has_res) {
    OPSMITH_DX_SETUP
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
            const A g = OPSMITH_DX_E(in[0], c, k);
            d += (has_w ? g * OPSMITH_DX_E(in[2], c, k) : g) * OPSMITH_DX_E(in[1], c, k);
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
            const A g = OPSMITH_DX_E(in[0], c, k), v = OPSMITH_DX_E(in[1], c, k);
            o[k] = r * ((has_w ? g * OPSMITH_DX_E(in[2], c, k) : g) - v * r * r * d);
            if (has_res) o[k] += OPSMITH_DX_E(res[0], c, k);
        }
        store_vec(grad_x + base, OPSMITH_DX_J(c), n, vec, o);
    }
}
