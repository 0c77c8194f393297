// opsmith.ops LayerNorm and RMSNorm, the rows too long for registers (norm.cu has the math and
// the register-row kernels): one block per row, the row cached in shared memory when the launch
// gave room (the weight and bias gradients after them: norm_bwd_weight, in norm_split.cu).
#include "common.cuh"

#ifndef OPSMITH_LONG_THREADS
#define OPSMITH_LONG_THREADS 1024
#endif

using namespace opsmith;

// -- long rows: one block per row, the row cached in shared memory when it fits --------------------
// One 16-byte vector a thread a trip. Two to four a trip with their loads issued together (as the
// register-row kernels' load_chunks) ran at half the speed on an H100 (2048 x 32768 bf16): they took
// 48-64 registers a thread, so one block of 1024 threads fit an SM where the launch plan counts two.
#define OPSMITH_LONG_LOOP(j) for (long long j = (long long)t * N; j < cols; j += (long long)tpr * N)
#define OPSMITH_SMEM2 (reinterpret_cast<T*>(opsmith_dyn_smem) + ((cols * sizeof(T) + 15) / 16) * 16 / sizeof(T))

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
layer_norm_fwd_long(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    T* __restrict__ y, A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols,
                    A eps, int has_w, int has_b, int cache) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    T* sm = reinterpret_cast<T*>(opsmith_dyn_smem);
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        A s = A(0);
        OPSMITH_LONG_LOOP(j) {
            A v[N];
            load_row(xr, sm, cache ? 1 : 0, j, cols, vec, v, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) s += v[k];
        }
        const A mu = row_allreduce(s, SumOp(), A(0), tpr) / A(cols);
        A q = A(0);
        OPSMITH_LONG_LOOP(j) {
            A v[N];
            load_row(xr, sm, cache ? 2 : 0, j, cols, vec, v, mu);  // padding: mu, adds 0
#pragma unroll
            for (int k = 0; k < N; ++k) q += (v[k] - mu) * (v[k] - mu);
        }
        const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
        if (t == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
        OPSMITH_LONG_LOOP(j) {
            A v[N], wv[N], bv[N];
            load_row(xr, sm, cache ? 2 : 0, j, cols, vec, v, A(0));
            if (has_w) load_vec(w, j, cols, vec, wv, A(1));
            if (has_b) load_vec(b, j, cols, vec, bv, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) {
                A o = (v[k] - mu) * r;
                if (has_w) o *= wv[k];
                if (has_b) o += bv[k];
                v[k] = o;
            }
            store_vec(y + row * cols, j, cols, vec, v);
        }
    }
}

// layer_norm's long-row backward; RES (layer_norm_bwd_long_res, add_layer_norm's): grad_res, the gradient that
// reached the new residual, added to grad_x
template <bool RES, class T, class A>
__device__ __forceinline__ void layer_norm_bwd_long_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                         const T* __restrict__ w, const A* __restrict__ mean,
                                                         const A* __restrict__ rstd, T* __restrict__ grad_x,
                                                         long long rows, int cols, int has_w, int cache,
                                                         const T* __restrict__ grad_res) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    T* smg = reinterpret_cast<T*>(opsmith_dyn_smem);
    T* smx = OPSMITH_SMEM2;
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x) &&
                     (!RES || aligned16(grad_res));
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long long base = row * cols;
        const A mu = mean[row], r = rstd[row];
        A s1 = A(0), s2 = A(0);
        OPSMITH_LONG_LOOP(j) {
            A g[N], v[N], wv[N];
            load_row(grad_y + base, smg, cache ? 1 : 0, j, cols, vec, g, A(0));
            load_row(x + base, smx, cache ? 1 : 0, j, cols, vec, v, A(0));
            if (has_w) load_vec(w, j, cols, vec, wv, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A gw = has_w ? g[k] * wv[k] : g[k];
                s1 += gw;
                s2 += gw * (v[k] - mu) * r;
            }
        }
        row_allreduce_sum2(s1, s2, tpr);
        s1 /= A(cols);
        s2 /= A(cols);
        OPSMITH_LONG_LOOP(j) {
            A g[N], v[N], wv[N];
            load_row(grad_y + base, smg, cache ? 2 : 0, j, cols, vec, g, A(0));
            load_row(x + base, smx, cache ? 2 : 0, j, cols, vec, v, A(0));
            if (has_w) load_vec(w, j, cols, vec, wv, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A gw = has_w ? g[k] * wv[k] : g[k];
                g[k] = r * (gw - s1 - (v[k] - mu) * r * s2);
            }
            if constexpr (RES) {
                A rv[N];
                load_vec(grad_res + base, j, cols, vec, rv, A(0));
#pragma unroll
                for (int k = 0; k < N; ++k) g[k] += rv[k];
            }
            store_vec(grad_x + base, j, cols, vec, g);
        }
    }
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
layer_norm_bwd_long(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                    const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                    long long rows, int cols, int has_w, int cache) {
    layer_norm_bwd_long_rows<false>(grad_y, x, w, mean, rstd, grad_x, rows, cols, has_w, cache, (const T*)nullptr);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
layer_norm_bwd_long_res(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                        const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                        long long rows, int cols, int has_w, int cache, const T* __restrict__ grad_res) {
    layer_norm_bwd_long_rows<true>(grad_y, x, w, mean, rstd, grad_x, rows, cols, has_w, cache, grad_res);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
rms_norm_fwd_long(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                  long long rows, int cols, A eps, int has_w, int cache) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    T* sm = reinterpret_cast<T*>(opsmith_dyn_smem);
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        A q = A(0);
        OPSMITH_LONG_LOOP(j) {
            A v[N];
            load_row(xr, sm, cache ? 1 : 0, j, cols, vec, v, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) q += v[k] * v[k] + nonfinite(v[k]);
        }
        const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
        if (t == 0) rstd[row] = r;
        OPSMITH_LONG_LOOP(j) {
            A v[N], wv[N];
            load_row(xr, sm, cache ? 2 : 0, j, cols, vec, v, A(0));
            if (has_w) load_vec(w, j, cols, vec, wv, A(1));
#pragma unroll
            for (int k = 0; k < N; ++k) v[k] = has_w ? v[k] * r * wv[k] : v[k] * r;
            store_vec(y + row * cols, j, cols, vec, v);
        }
    }
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
rms_norm_bwd_long(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                  const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows, int cols, int has_w,
                  int cache) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    T* smg = reinterpret_cast<T*>(opsmith_dyn_smem);
    T* smx = OPSMITH_SMEM2;
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long long base = row * cols;
        const A r = rstd[row];
        A d = A(0);
        OPSMITH_LONG_LOOP(j) {
            A g[N], v[N], wv[N];
            load_row(grad_y + base, smg, cache ? 1 : 0, j, cols, vec, g, A(0));
            load_row(x + base, smx, cache ? 1 : 0, j, cols, vec, v, A(0));
            if (has_w) load_vec(w, j, cols, vec, wv, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) d += (has_w ? g[k] * wv[k] : g[k]) * v[k];
        }
        d = row_allreduce(d, SumOp(), A(0), tpr) / A(cols);
        OPSMITH_LONG_LOOP(j) {
            A g[N], v[N], wv[N];
            load_row(grad_y + base, smg, cache ? 2 : 0, j, cols, vec, g, A(0));
            load_row(x + base, smx, cache ? 2 : 0, j, cols, vec, v, A(0));
            if (has_w) load_vec(w, j, cols, vec, wv, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) g[k] = r * ((has_w ? g[k] * wv[k] : g[k]) - v[k] * r * r * d);
            store_vec(grad_x + base, j, cols, vec, g);
        }
    }
}
