// bench/diag_pipe.py's kernels: the register-row forwards (softmax, rms_norm, layer_norm) as
// persistent blocks that copy the rows of the next PIPE_STAGES - 1 trips into shared memory with
// cp.async (sm_80+) while they work on the current trip's rows, so that a thread's loads stay in
// flight through its reductions instead of only before them. Each thread copies and reads back its
// own 16-byte chunks ([stage][row of block][chunk][thread]), so no barrier guards the stages.
#include "common.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
#ifndef PIPE_STAGES
#define PIPE_STAGES 2
#endif
#ifndef PIPE_BLOCKS
#define PIPE_BLOCKS 3
#endif
#ifndef PIPE_CS
#define PIPE_CS 0
#endif

using namespace opsmith;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#else
    *reinterpret_cast<Raw*>(dst) = *reinterpret_cast<const Raw*>(src);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int K> __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(K) : "memory");
#endif
}

template <class T> __device__ __forceinline__ void store_raw(T* p, const Raw& v) {
#if PIPE_CS
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.u[0]), "r"(v.u[1]), "r"(v.u[2]),
                 "r"(v.u[3]) : "memory");
#else
    *reinterpret_cast<Raw*>(p) = v;
#endif
}

// N floats to a Raw of T
template <class T, class A> __device__ __forceinline__ Raw pack(const A* in) {
    constexpr int N = Vec<T>::N;
    Raw r = {{0u, 0u, 0u, 0u}};
#pragma unroll
    for (int k = 0; k < N; ++k) raw_put<T>(r, k, Elem<T>::store(in[k]));
    return r;
}

// Issue the copies of one row's chunks (this thread's) into `dst` (chunk c at dst[c * tpr]).
template <class T>
__device__ __forceinline__ void pipe_issue(const T* __restrict__ src, long long row, long long rows, int cols,
                                           bool vec, Raw* dst, int tpr, int t) {
    constexpr int N = Vec<T>::N, C = OPSMITH_ROW_CHUNKS;
    if (row < rows) {
        const T* r = src + row * (long long)cols;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int j = (c * tpr + t) * N;
            if (vec) {
                if (j < cols) cp_async16(dst + c * tpr, r + j);
            } else {
                const T zero = Elem<T>::store(typename Elem<T>::acc(0));
                Raw z = {{0u, 0u, 0u, 0u}};
#pragma unroll
                for (int k = 0; k < N; ++k) raw_put<T>(z, k, j + k < cols ? r[j + k] : zero);
                dst[c * tpr] = z;
            }
        }
    }
    cp_async_commit();  // one group a trip, empty or not: wait_group counts trips
}

// The weight (and bias) of a persistent block: loaded once into shared memory after the stages
// (params[p][c][t]: array p, chunk c of thread t), read from there where used, so that they take
// no registers through the trips. Threads of row 0 load them, one barrier publishes them.
template <class T, int P>
__device__ __forceinline__ const Raw* pipe_params(const T* const (&src)[P], Raw* params, int cols, bool vec,
                                                  int tpr, int t, unsigned on) {
    constexpr int C = OPSMITH_ROW_CHUNKS;
    if (threadIdx.y == 0) {
        Raw in[P][C];
        load_chunks<T, P>(src, in, cols, vec, tpr, t, on);
#pragma unroll
        for (int q = 0; q < P; ++q)
#pragma unroll
            for (int c = 0; c < C; ++c) params[(q * C + c) * tpr + t] = in[q][c];
    }
    __syncthreads();
    return params + t;
}

#define PIPE_SETUP                                                                          \
    constexpr int N = Vec<T>::N, C = OPSMITH_ROW_CHUNKS, S = PIPE_STAGES;                   \
    const int tpr = blockDim.x, t = threadIdx.x, R = blockDim.y, ty = threadIdx.y;          \
    Raw* const stage0 = reinterpret_cast<Raw*>(opsmith_dyn_smem) + ty * C * tpr + t;        \
    const int stage_step = R * C * tpr;                                                     \
    const long long stride = (long long)gridDim.x * R;                                      \
    const long long first = blockIdx.x * (long long)R + ty;                                 \
    for (int s = 0; s < S - 1; ++s)                                                         \
        pipe_issue<T>(x, first + s * stride, rows, cols, vec, stage0 + s * stage_step, tpr, t); \
    int cur = 0;

// the trip loop: uniform over the block (row0 is the block's first row of the trip)
#define PIPE_LOOP                                                                           \
    for (long long row = first, row0 = blockIdx.x * (long long)R; row0 < rows; row += stride, row0 += stride)

// issue the trip S-1 ahead, wait for this trip's, read it (chunks past the row's end: zeros)
#define PIPE_READ(in)                                                                       \
    {                                                                                       \
        const int nxt = cur == 0 ? S - 1 : cur - 1;                                         \
        pipe_issue<T>(x, row + (S - 1) * stride, rows, cols, vec, stage0 + nxt * stage_step, tpr, t); \
        cp_async_wait<S - 1>();                                                             \
        _Pragma("unroll") for (int c = 0; c < C; ++c) {                                     \
            const Raw z = {{0u, 0u, 0u, 0u}};                                               \
            in[c] = (active && (c * tpr + t) * N < cols) ? stage0[cur * stage_step + c * tpr] : z; \
        }                                                                                   \
        cur = cur + 1 == S ? 0 : cur + 1;                                                   \
    }

template <class T>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, PIPE_BLOCKS)
softmax_fwd_pipe(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    typedef typename Elem<T>::acc A;
    const bool vec = cols % Vec<T>::N == 0 && aligned16(x) && aligned16(y);
    PIPE_SETUP
    PIPE_LOOP {
        const bool active = row < rows;
        Raw in[C];
        PIPE_READ(in)
        A v[C * N];
#pragma unroll
        for (int i = 0; i < C * N; ++i) {
            const int col = ((i / N) * tpr + t) * N + i % N;
            v[i] = active && col < cols ? raw_get<T>(in[i / N], i % N) : neg_inf<A>();
        }
        A m = neg_inf<A>();
#pragma unroll
        for (int i = 0; i < C * N; ++i) m = m_max(m, v[i]);
        m = row_allreduce(m, MaxOp(), neg_inf<A>(), tpr);
        A s = A(0);
#pragma unroll
        for (int i = 0; i < C * N; ++i) {
            v[i] = m_expe(v[i] - m);
            s += v[i];
        }
        s = row_allreduce(s, SumOp(), A(0), tpr);
        const A r = A(1) / s;
#pragma unroll
        for (int i = 0; i < C * N; ++i) v[i] *= r;
        if (active) {
            T* yr = y + row * (long long)cols;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int j = (c * tpr + t) * N;
                if (vec) {
                    if (j < cols) store_raw(yr + j, pack<T>(v + c * N));
                } else {
                    store_vec(yr, j, cols, false, v + c * N);
                }
            }
        }
    }
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, PIPE_BLOCKS)
rms_norm_fwd_pipe(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                  long long rows, int cols, A eps, int has_w) {
    const bool vec = cols % Vec<T>::N == 0 && aligned16(x) && aligned16(y) && aligned16(w);
    PIPE_SETUP
    const Raw* wr = pipe_params<T, 1>({w}, stage0 - ty * C * tpr - t + S * stage_step, cols, vec, tpr, t,
                                      has_w ? 1u : 0u);
    PIPE_LOOP {
        const bool active = row < rows;
        Raw in[C];
        PIPE_READ(in)
        A q = A(0);
#pragma unroll
        for (int i = 0; i < C * N; ++i) {
            const A v = raw_get<T>(in[i / N], i % N);
            q += v * v + nonfinite(v);
        }
        const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
        if (active) {
            if (t == 0) rstd[row] = r;
            T* yr = y + row * (long long)cols;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    o[k] = raw_get<T>(in[c], k) * r;
                    if (has_w) o[k] *= raw_get<T>(wr[c * tpr], k);
                }
                const int j = (c * tpr + t) * N;
                if (vec) {
                    if (j < cols) store_raw(yr + j, pack<T>(o));
                } else {
                    store_vec(yr, j, cols, false, o);
                }
            }
        }
    }
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, PIPE_BLOCKS)
layer_norm_fwd_pipe(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                    A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    const bool vec = cols % Vec<T>::N == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b);
    PIPE_SETUP
    const Raw* wb = pipe_params<T, 2>({w, b}, stage0 - ty * C * tpr - t + S * stage_step, cols, vec, tpr, t,
                                      (has_w ? 1u : 0u) | (has_b ? 2u : 0u));
    PIPE_LOOP {
        const bool active = row < rows;
        Raw in[C];
        PIPE_READ(in)
        A s = A(0);
#pragma unroll
        for (int i = 0; i < C * N; ++i) s += raw_get<T>(in[i / N], i % N);
        const A mu = row_allreduce(s, SumOp(), A(0), tpr) / A(cols);
        A q = A(0);
#pragma unroll
        for (int i = 0; i < C * N; ++i) {
            const int col = ((i / N) * tpr + t) * N + i % N;
            const A d = col < cols ? raw_get<T>(in[i / N], i % N) - mu : A(0);
            q += d * d;
        }
        const A r = m_rsqrt(row_allreduce(q, SumOp(), A(0), tpr) / A(cols) + eps);
        if (active) {
            if (t == 0) {
                mean[row] = mu;
                rstd[row] = r;
            }
            T* yr = y + row * (long long)cols;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    o[k] = (raw_get<T>(in[c], k) - mu) * r;
                    if (has_w) o[k] *= raw_get<T>(wb[c * tpr], k);
                    if (has_b) o[k] += raw_get<T>(wb[(C + c) * tpr], k);
                }
                const int j = (c * tpr + t) * N;
                if (vec) {
                    if (j < cols) store_raw(yr + j, pack<T>(o));
                } else {
                    store_vec(yr, j, cols, false, o);
                }
            }
        }
    }
}
