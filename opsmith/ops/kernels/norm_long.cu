// opsmith.ops LayerNorm and RMSNorm, the rows too long for registers (norm.cu has the math and
// the register-row kernels): one block per row, the row cached in shared memory when the launch
// gave room; and norm_bwd_weight, the weight and bias gradients after these backwards.
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

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
layer_norm_bwd_long(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                    const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                    long long rows, int cols, int has_w, int cache) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    T* smg = reinterpret_cast<T*>(opsmith_dyn_smem);
    T* smx = OPSMITH_SMEM2;
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
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
            store_vec(grad_x + base, j, cols, vec, g);
        }
    }
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

// -- grad_w and grad_b: column sums over the rows ---------------------------------------------------
// Block (32, 8): 32 column lanes of a 16-byte vector each (Vec<T>::N columns), 8 row lanes; blockIdx.y
// a chunk of `rows_per_chunk` rows. dw = sum over the chunk of grad_y * xhat, db = sum of grad_y
// (has_mean = 0, rms_norm: xhat = x * rstd). One chunk: the sums rounded to T into dw_out / db_out;
// else a row of partials a chunk, dw_part[chunk][col] in A, which norm_col_sum adds up. (Adding them
// up here instead, in the last block of each column block to finish, as CUDA's threadFenceReduction
// sample, measured 1-1.5 us slower than norm_col_sum's launch: one block reads all the chunks.)
template <class T, class A>
__global__ void __launch_bounds__(256)
norm_bwd_weight(const T* __restrict__ grad_y, const T* __restrict__ x, const A* __restrict__ mean,
                const A* __restrict__ rstd, A* __restrict__ dw_part, A* __restrict__ db_part, T* __restrict__ dw_out,
                T* __restrict__ db_out, long long rows, int cols, int rows_per_chunk, int has_mean, int want_w,
                int want_b) {
    constexpr int N = Vec<T>::N, W = 32 * N;  // columns a block
    __shared__ A sw[8][W], sb[8][W];
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x);
    const long long c0 = (long long)blockIdx.x * W + threadIdx.x * N;
    const long long r0 = (long long)blockIdx.y * rows_per_chunk;
    const long long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    A dw[N], db[N];
#pragma unroll
    for (int k = 0; k < N; ++k) dw[k] = db[k] = A(0);
    long long r = r0 + threadIdx.y;
    if (vec && c0 < cols) {  // whole 16-byte vectors: four rows' loads issued before any is used
        for (; r + 24 < r1; r += 32) {
            Raw gr[4], xr[4];
            A mu[4], rs[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                gr[u] = *reinterpret_cast<const Raw*>(grad_y + (r + 8 * u) * cols + c0);
                xr[u] = *reinterpret_cast<const Raw*>(x + (r + 8 * u) * cols + c0);
                mu[u] = has_mean ? mean[r + 8 * u] : A(0);
                rs[u] = rstd[r + 8 * u];
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
        for (; r < r1; r += 8) {  // the rest (and rows that allow no 16-byte access)
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
    for (int k = 0; k < N; ++k) {  // element k of each lane's vector: consecutive lanes, consecutive banks
        sw[threadIdx.y][k * 32 + threadIdx.x] = dw[k];
        sb[threadIdx.y][k * 32 + threadIdx.x] = db[k];
    }
    __syncthreads();
    const int tid = threadIdx.y * 32 + threadIdx.x;
    const long long first = (long long)blockIdx.x * W;
    for (int i = tid; i < W && first + i < cols; i += 256) {  // i: the block's column i, lane i / N's element i % N
        const long long col = first + i;
        const int s = (i % N) * 32 + i / N;
        A a = A(0), b = A(0);
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            a += sw[l][s];
            b += sb[l][s];
        }
        if (gridDim.y == 1) {
            if (want_w) dw_out[col] = Elem<T>::store(a);
            if (want_b) db_out[col] = Elem<T>::store(b);
        } else {
            if (want_w) dw_part[(long long)blockIdx.y * cols + col] = a;
            if (want_b) db_part[(long long)blockIdx.y * cols + col] = b;
        }
    }
}
