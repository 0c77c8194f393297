// opsmith.ops LayerNorm and RMSNorm, the rows too long for registers (norm.cu has the math and
// the register-row kernels): one block per row, the row cached in shared memory when the launch
// gave room; and norm_bwd_weight, the weight and bias gradients after these backwards.
#include "common.cuh"

#ifndef OPSMITH_LONG_THREADS
#define OPSMITH_LONG_THREADS 1024
#endif

using namespace opsmith;

// -- long rows: one block per row, the row cached in shared memory when it fits --------------------
#define OPSMITH_SMEM2 (reinterpret_cast<T*>(opsmith_dyn_smem) + ((cols * sizeof(T) + 15) / 16) * 16 / sizeof(T))

// element k of vector u of array s of a trip (load_group's out), in A
#define OPSMITH_G(a, s, u, k) raw_get<T>((a)[s][u], k)
// vectors of each array in a trip's `in`
#define OPSMITH_NU(a) ((int)(sizeof((a)[0]) / sizeof(Raw)))
// column of element k of vector u of the trip at j0
#define OPSMITH_GC(j0, u, k) (OPSMITH_LJ(j0, u) + (k))

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
layer_norm_fwd_long(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    T* __restrict__ y, A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols,
                    A eps, int has_w, int has_b, int cache) {
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    T* sm = reinterpret_cast<T*>(opsmith_dyn_smem);
    T* const sm1[1] = {cache ? sm : nullptr};
    T* const none3[3] = {cache ? sm : nullptr, nullptr, nullptr};
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b);
    const unsigned wb = 1u | (has_w ? 2u : 0u) | (has_b ? 4u : 0u);
    // a thread reads back from shared memory only what it wrote there itself: no barrier needed
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        A s = A(0);
        OPSMITH_GROUP_LOOP(j0, 4) {
            Raw in[1][4];
            load_group<T, 1, 4>({xr}, sm1, 1, 1u, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u)
#pragma unroll
                for (int k = 0; k < N; ++k) s += OPSMITH_G(in, 0, u, k);  // padding is 0
        }
        const A mu = row_allreduce(s, SumOp(), A(0), tpr) / A(cols);
        A q = A(0);
        OPSMITH_GROUP_LOOP(j0, 4) {
            Raw in[1][4];
            load_group<T, 1, 4>({xr}, sm1, 2, 1u, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u)
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A d = OPSMITH_GC(j0, u, k) < cols ? OPSMITH_G(in, 0, u, k) - mu : A(0);
                    q += d * d;
                }
        }
        const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
        if (t == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
        OPSMITH_GROUP_LOOP(j0, 2) {
            Raw in[3][2];
            load_group<T, 3, 2>({xr, w, b}, none3, 2, wb, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    o[k] = (OPSMITH_G(in, 0, u, k) - mu) * r;
                    if (has_w) o[k] *= OPSMITH_G(in, 1, u, k);
                    if (has_b) o[k] += OPSMITH_G(in, 2, u, k);
                }
                store_vec(y + row * cols, OPSMITH_LJ(j0, u), cols, vec, o);
            }
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
    T* const sm3[3] = {cache ? reinterpret_cast<T*>(opsmith_dyn_smem) : nullptr, cache ? OPSMITH_SMEM2 : nullptr,
                       nullptr};
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
    const unsigned on = has_w ? 7u : 3u;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long long base = row * cols;
        const A mu = mean[row], r = rstd[row];
        A s1 = A(0), s2 = A(0);
        OPSMITH_GROUP_LOOP(j0, 2) {
            Raw in[3][2];
            load_group<T, 3, 2>({grad_y + base, x + base, w}, sm3, 1, on, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u)
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = OPSMITH_G(in, 0, u, k), gw = has_w ? g * OPSMITH_G(in, 2, u, k) : g;
                    s1 += gw;  // padding: g is 0
                    s2 += gw * (OPSMITH_G(in, 1, u, k) - mu) * r;
                }
        }
        row_allreduce_sum2(s1, s2, tpr);
        s1 /= A(cols);
        s2 /= A(cols);
        OPSMITH_GROUP_LOOP(j0, 2) {
            Raw in[3][2];
            load_group<T, 3, 2>({grad_y + base, x + base, w}, sm3, 2, on, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = OPSMITH_G(in, 0, u, k), gw = has_w ? g * OPSMITH_G(in, 2, u, k) : g;
                    o[k] = r * (gw - s1 - (OPSMITH_G(in, 1, u, k) - mu) * r * s2);
                }
                store_vec(grad_x + base, OPSMITH_LJ(j0, u), cols, vec, o);
            }
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
    T* const sm1[1] = {cache ? sm : nullptr};
    T* const sm2[2] = {cache ? sm : nullptr, nullptr};
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        A q = A(0);
        OPSMITH_GROUP_LOOP(j0, 4) {
            Raw in[1][4];
            load_group<T, 1, 4>({xr}, sm1, 1, 1u, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u)
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A v = OPSMITH_G(in, 0, u, k);
                    q += v * v + nonfinite(v);
                }
        }
        const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
        if (t == 0) rstd[row] = r;
        OPSMITH_GROUP_LOOP(j0, 2) {
            Raw in[2][2];
            load_group<T, 2, 2>({xr, w}, sm2, 2, has_w ? 3u : 1u, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A v = OPSMITH_G(in, 0, u, k);
                    o[k] = has_w ? v * r * OPSMITH_G(in, 1, u, k) : v * r;
                }
                store_vec(y + row * cols, OPSMITH_LJ(j0, u), cols, vec, o);
            }
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
    T* const sm3[3] = {cache ? reinterpret_cast<T*>(opsmith_dyn_smem) : nullptr, cache ? OPSMITH_SMEM2 : nullptr,
                       nullptr};
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x);
    const unsigned on = has_w ? 7u : 3u;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long long base = row * cols;
        const A r = rstd[row];
        A d = A(0);
        OPSMITH_GROUP_LOOP(j0, 2) {
            Raw in[3][2];
            load_group<T, 3, 2>({grad_y + base, x + base, w}, sm3, 1, on, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u)
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = OPSMITH_G(in, 0, u, k);
                    d += (has_w ? g * OPSMITH_G(in, 2, u, k) : g) * OPSMITH_G(in, 1, u, k);
                }
        }
        d = row_allreduce(d, SumOp(), A(0), tpr) / A(cols);
        OPSMITH_GROUP_LOOP(j0, 2) {
            Raw in[3][2];
            load_group<T, 3, 2>({grad_y + base, x + base, w}, sm3, 2, on, j0, tpr, cols, vec, in);
#pragma unroll
            for (int u = 0; u < OPSMITH_NU(in); ++u) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = OPSMITH_G(in, 0, u, k), v = OPSMITH_G(in, 1, u, k);
                    o[k] = r * ((has_w ? g * OPSMITH_G(in, 2, u, k) : g) - v * r * r * d);
                }
                store_vec(grad_x + base, OPSMITH_LJ(j0, u), cols, vec, o);
            }
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
