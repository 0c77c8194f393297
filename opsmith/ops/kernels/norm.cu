// opsmith.ops LayerNorm and RMSNorm over the last dimension (rows of `cols` elements).
//
//   layer_norm: y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)  (biased variance)
//   rms_norm:   y = x * rstd * w,               rstd = 1 / sqrt(mean(x^2) + eps)
// The forward saves mean and rstd per row (in the accumulation type) for the backward:
//   layer_norm: grad_x = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),  gw = grad_y * w,
//               xhat = (x - mean) * rstd
//   rms_norm:   grad_x = rstd * (gw - x * rstd^2 * mean(gw * x))
// grad_w and grad_b are column sums over the rows: norm_bwd_weight writes partial sums per
// chunk of rows (one block per 32 columns x chunk), which the caller adds up.
//
// The strategies are softmax.cu's: the row in registers (*_fwd, *_bwd; tpr threads per row,
// tpr <= 32 is one warp per row), or one block per long row (*_long) with the row copied into
// shared memory on the first pass when the launch gave room (`cache` = 1), else read again.
// The variance is the mean of squared deviations from the mean (two passes over the row),
// not E[x^2] - E[x]^2, which cancels catastrophically for rows with a large mean.
// `has_w` / `has_b` = 0: no weight / bias (the pointer is then any tensor and is not read).
// inf and NaN as torch on CUDA: an inf or NaN in a row makes the whole row NaN, for layer_norm
// (mean inf, inf - inf) and for rms_norm too, where mean(x^2) = inf alone would give rstd = 0
// and finite outputs of 0, so its sum of squares adds nonfinite(x) (0, or NaN for inf/NaN).
#include "common.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
#ifndef OPSMITH_LONG_THREADS
#define OPSMITH_LONG_THREADS 1024
#endif

using namespace opsmith;

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS)
layer_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
               A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
               int has_b) {
    OPSMITH_ROW_SETUP
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b);
    A v[C * N];
#pragma unroll
    for (int c = 0; c < C; ++c) load_vec(x + base, (long long)(c * tpr + t) * N, n, vec, v + c * N, A(0));
    A s = A(0);
#pragma unroll
    for (int i = 0; i < C * N; ++i) s += v[i];
    const A mu = row_allreduce(s, SumOp(), A(0), tpr) / A(cols);
    A q = A(0);
#pragma unroll
    for (int i = 0; i < C * N; ++i) {
        const A d = OPSMITH_COL(i) < n ? v[i] - mu : A(0);
        q += d * d;
    }
    const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (!active) return;  // no reduction follows
    if (t == 0) {
        mean[row] = mu;
        rstd[row] = r;
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const long long j = (long long)(c * tpr + t) * N;
        A wv[N], bv[N];
        if (has_w) load_vec(w, j, n, vec, wv, A(1));
        if (has_b) load_vec(b, j, n, vec, bv, A(0));
#pragma unroll
        for (int k = 0; k < N; ++k) {
            A o = (v[c * N + k] - mu) * r;
            if (has_w) o *= wv[k];
            if (has_b) o += bv[k];
            v[c * N + k] = o;
        }
        store_vec(y + base, j, n, vec, v + c * N);
    }
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS)
layer_norm_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
               const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows,
               int cols, int has_w) {
    OPSMITH_ROW_SETUP
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
    const A mu = active ? mean[row] : A(0), r = active ? rstd[row] : A(0);
    A gw[C * N], xh[C * N];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const long long j = (long long)(c * tpr + t) * N;
        load_vec(grad_y + base, j, n, vec, gw + c * N, A(0));
        load_vec(x + base, j, n, vec, xh + c * N, A(0));
        if (has_w) {
            A wv[N];
            load_vec(w, j, n, vec, wv, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) gw[c * N + k] *= wv[k];
        }
    }
    A s1 = A(0), s2 = A(0);
#pragma unroll
    for (int i = 0; i < C * N; ++i) {
        xh[i] = (xh[i] - mu) * r;
        s1 += gw[i];
        s2 += gw[i] * xh[i];  // padding: gw is 0
    }
    s1 = row_allreduce(s1, SumOp(), A(0), tpr) / A(cols);
    s2 = row_allreduce(s2, SumOp(), A(0), tpr) / A(cols);
    if (!active) return;
#pragma unroll
    for (int i = 0; i < C * N; ++i) gw[i] = r * (gw[i] - s1 - xh[i] * s2);
#pragma unroll
    for (int c = 0; c < C; ++c) store_vec(grad_x + base, (long long)(c * tpr + t) * N, n, vec, gw + c * N);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS)
rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
             long long rows, int cols, A eps, int has_w) {
    OPSMITH_ROW_SETUP
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w);
    A v[C * N];
#pragma unroll
    for (int c = 0; c < C; ++c) load_vec(x + base, (long long)(c * tpr + t) * N, n, vec, v + c * N, A(0));
    A q = A(0);
#pragma unroll
    for (int i = 0; i < C * N; ++i) q += v[i] * v[i] + nonfinite(v[i]);
    const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (!active) return;
    if (t == 0) rstd[row] = r;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const long long j = (long long)(c * tpr + t) * N;
        A wv[N];
        if (has_w) load_vec(w, j, n, vec, wv, A(1));
#pragma unroll
        for (int k = 0; k < N; ++k) v[c * N + k] = has_w ? v[c * N + k] * r * wv[k] : v[c * N + k] * r;
        store_vec(y + base, j, n, vec, v + c * N);
    }
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS)
rms_norm_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
             const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows, int cols, int has_w) {
    OPSMITH_ROW_SETUP
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
    const A r = active ? rstd[row] : A(0);
    A gw[C * N], v[C * N];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const long long j = (long long)(c * tpr + t) * N;
        load_vec(grad_y + base, j, n, vec, gw + c * N, A(0));
        load_vec(x + base, j, n, vec, v + c * N, A(0));
        if (has_w) {
            A wv[N];
            load_vec(w, j, n, vec, wv, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) gw[c * N + k] *= wv[k];
        }
    }
    A d = A(0);
#pragma unroll
    for (int i = 0; i < C * N; ++i) d += gw[i] * v[i];
    d = row_allreduce(d, SumOp(), A(0), tpr) / A(cols);
    if (!active) return;
#pragma unroll
    for (int i = 0; i < C * N; ++i) gw[i] = r * (gw[i] - v[i] * r * r * d);
#pragma unroll
    for (int c = 0; c < C; ++c) store_vec(grad_x + base, (long long)(c * tpr + t) * N, n, vec, gw + c * N);
}

// -- long rows: one block per row, the row cached in shared memory when it fits --------------------
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
        s1 = row_allreduce(s1, SumOp(), A(0), tpr) / A(cols);
        s2 = row_allreduce(s2, SumOp(), A(0), tpr) / A(cols);
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
// Block (32, 8): 32 columns, 8 row lanes; blockIdx.y is a chunk of `rows_per_chunk` rows.
// dw_part[chunk][col] = sum over the chunk of grad_y * xhat; db_part[chunk][col] = sum of grad_y.
// has_mean = 0 (rms_norm): xhat = x * rstd.
template <class T, class A>
__global__ void __launch_bounds__(256)
norm_bwd_weight(const T* __restrict__ grad_y, const T* __restrict__ x, const A* __restrict__ mean,
                const A* __restrict__ rstd, A* __restrict__ dw_part, A* __restrict__ db_part, long long rows,
                int cols, int rows_per_chunk, int has_mean) {
    __shared__ A sw[8][33], sb[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * rows_per_chunk;
    const long long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    A dw = A(0), db = A(0);
    if (col < cols) {
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
            const A g = Elem<T>::load(grad_y[r * cols + col]);
            const A xh = (Elem<T>::load(x[r * cols + col]) - (has_mean ? mean[r] : A(0))) * rstd[r];
            dw += g * xh;
            db += g;
        }
    }
    sw[threadIdx.y][threadIdx.x] = dw;
    sb[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
#pragma unroll
        for (int i = 1; i < 8; ++i) {
            dw += sw[i][threadIdx.x];
            db += sb[i][threadIdx.x];
        }
        dw_part[(long long)blockIdx.y * cols + col] = dw;
        db_part[(long long)blockIdx.y * cols + col] = db;
    }
}
