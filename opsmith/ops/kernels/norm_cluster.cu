// opsmith.ops LayerNorm and RMSNorm (norm.cu has the math) for rows too long for one block's registers
// and short enough for a thread-block cluster's (sm_90+): a cluster of K blocks (__cluster_dims__, K =
// 2 or 8) holds a row, each block a slice of C * N * tpr elements in its registers (C 16-byte chunks a
// thread: 2, as the register-row kernels, or 4 in the forwards of the longest rows), and the blocks
// add up the row's sums through distributed shared memory (rows.cuh's cluster_sum). The row is read
// once from HBM, where the long kernels (norm_long.cu) of one block a row read it twice or stage it
// in shared memory.
//
// Every kernel is persistent: `groups` = gridDim.x / K clusters stride over the rows, loading a row's
// slice one trip ahead. The backwards keep their slice of the weight (and bias) gradients in
// registers and write one row of partial sums a cluster at the end (part[cluster][cols], added up by
// norm_split.cu's norm_col_sum): grad and x are read once.
// Slices past a row's end (the last ones of a row shorter than K * C * N * tpr) hold zeros.
#include "rows.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
// blocks of OPSMITH_ROW_THREADS an SM holds at once in the forwards of 2 chunks a thread
// (_launch.CLUSTER_FWD_BLOCKS; 1 in those of 4)
#ifndef OPSMITH_CLUSTER_FWD_BLOCKS
#define OPSMITH_CLUSTER_FWD_BLOCKS 2
#endif
#ifndef OPSMITH_ROW_BWD_BLOCKS
#define OPSMITH_ROW_BWD_BLOCKS 1
#endif

using namespace opsmith;

// element k of chunk c lies inside the slice (vec: chunks are wholly inside or wholly past it)
#define OPSMITH_IN(c, k) (vec ? OPSMITH_J(c) < n : OPSMITH_J(c) + (k) < n)

// rms_norm's inf check (rows.cuh's rms_inf_rows, for a cluster): the sum of squares q is inf, the same
// in every block of the cluster; where a slice of x holds an inf, the whole row becomes NaN.
template <int K, int CH, class T, class A>
__device__ __forceinline__ void rms_inf_slice(const T* __restrict__ xs, T* __restrict__ ys, A* rstd_row, int n,
                                              A (&slot)[2][K][1], unsigned long long (&bar)[2], int& round,
                                              bool first) {
    constexpr int N = Vec<T>::N, C = CH;
    const int tpr = blockDim.x, t = threadIdx.x;
    int any = 0;
    for (int c = 0; c < C; ++c)
        for (int k = 0; k < N; ++k) {
            const long long j = OPSMITH_J(c) + k;
            if (j < n) {
                Raw r = {{0u, 0u, 0u, 0u}};
                raw_put<T>(r, 0, xs[j]);
                any |= raw_nonfinite<T>(r) ? 1 : 0;
            }
        }
    A a[1] = {A(__syncthreads_or(any) ? 1 : 0)};
    cluster_sum<K>(a, slot, bar, round);
    if (a[0] == A(0)) return;
    const A nan = nonfinite(pos_inf<A>());
    for (int c = 0; c < C; ++c)
        for (int k = 0; k < N; ++k) {
            const long long j = OPSMITH_J(c) + k;
            if (j < n) ys[j] = Elem<T>::store(nan);
        }
    if (first && t == 0) *rstd_row = nan;
}

// a trip's slice of x for row r_ (zeros past the last row), loaded a trip ahead ...
#define OPSMITH_CL_X(dst, r_)                                                             \
    {                                                                                   \
        const bool a_ = (r_) < rows;                                                    \
        load_chunks<T, 1>({x + (a_ ? (r_) : 0) * (long long)cols + off}, dst, a_ ? n : 0, vec, tpr, t); \
    }
// ... and of the residual too (rms_fwd_rows with RES)
#define OPSMITH_CL_XR(dst, r_)                                                            \
    {                                                                                   \
        const bool a_ = (r_) < rows;                                                    \
        const long long b_ = (a_ ? (r_) : 0) * (long long)cols + off;                   \
        load_chunks<T, 2>({x + b_, res + b_}, dst, a_ ? n : 0, vec, tpr, t, RES ? 3u : 1u); \
    }

// rms_norm's forward, and with RES add_rms_norm's (fused_norm.cu): s = x + residual, rounded to T,
// is written to residual_out and normalised in place of x.
template <int K, int CH, bool RES, class T, class A>
__device__ __forceinline__ void rms_fwd_rows(const T* __restrict__ x, const T* __restrict__ res,
                                             const T* __restrict__ w, T* __restrict__ y, T* __restrict__ res_out,
                                             A* __restrict__ rstd, long long rows, int cols, A eps, int has_w) {
    OPSMITH_SLICE_SETUP
    OPSMITH_CLUSTER_RED(1)
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w) &&
                     (!RES || (aligned16(res) && aligned16(res_out)));
    // the weight (kept in registers for all the rows where a thread holds 2 chunks; read again each
    // row, from L1, where it holds 4: kept, it would not fit 64 registers) and this trip's x (and
    // residual), as loaded (zeros past the slice)
    Raw wr[1][C], in[2][C];  // in[1]: the residual (unused, so dropped, without RES)
    if (C <= 2) load_chunks<T, 1>({w + off}, wr, n, vec, tpr, t, has_w ? 1u : 0u);
    OPSMITH_CL_XR(in, (long long)(blockIdx.x / K))
    OPSMITH_CL_ROWS(rows) {
        const long long base = row * cols + off;
        Raw nx[2][C];
        OPSMITH_CL_XR(nx, row + groups)
        A p[2] = {A(0), A(0)};
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (RES) {
                A sv[N];
#pragma unroll
                for (int k = 0; k < N; ++k) sv[k] = OPSMITH_E(in[0], c, k) + OPSMITH_E(in[RES ? 1 : 0], c, k);
                in[0][c] = raw_pack<T>(sv);  // rounded to T, as the residual stream holds it
                store_chunk<T>(res_out + base, OPSMITH_J(c), n, vec, in[0][c]);
            }
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = OPSMITH_E(in[0], c, k);
                p[k & 1] += v * v;
            }
        }
        A q[1] = {row_allreduce<true>(p[0] + p[1], SumOp(), A(0), tpr)};
        cluster_sum<K>(q, cl_slot_, cl_bar_, cl_round_);
        const A r = m_rsqrt(q[0] / A(cols) + eps);
        if (off == 0 && t == 0) rstd[row] = r;
        if (C > 2) load_chunks<T, 1>({w + off}, wr, n, vec, tpr, t, has_w ? 1u : 0u);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = OPSMITH_E(in[0], c, k);
                o[k] = has_w ? v * r * OPSMITH_E(wr[0], c, k) : v * r;
            }
            store_vec(y + base, OPSMITH_J(c), n, vec, o);
        }
        if (q[0] == pos_inf<A>())  // the whole cluster takes this branch or none of it (s read back: own chunks)
            rms_inf_slice<K, C, T>((RES ? res_out : x) + base, y + base, rstd + row, n, cl_slot_, cl_bar_, cl_round_,
                                   off == 0);
#pragma unroll
        for (int c = 0; c < C; ++c) {
#pragma unroll
            for (int a = 0; a < (RES ? 2 : 1); ++a) in[a][c] = nx[a][c];
        }
    }
    cluster_arrive_relaxed();
    cluster_wait();
}

template <int K, int CH, class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (CH > 2 ? 1 : OPSMITH_CLUSTER_FWD_BLOCKS)) OPSMITH_CLUSTER_DIMS(K)
rms_norm_fwd_cluster(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                     long long rows, int cols, A eps, int has_w) {
    rms_fwd_rows<K, CH, false>(x, x, w, y, y, rstd, rows, cols, eps, has_w);
}

// add_rms_norm's forward (fused_norm.cu's signature), for the rows rms_norm_fwd_cluster serves
template <int K, int CH, class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (CH > 2 ? 1 : OPSMITH_CLUSTER_FWD_BLOCKS)) OPSMITH_CLUSTER_DIMS(K)
add_rms_norm_fwd_cluster(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                         T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows,
                         int cols, A eps, int has_w) {
    rms_fwd_rows<K, CH, true>(x, residual, w, y, residual_out, rstd, rows, cols, eps, has_w);
}

// w and b are read after the reductions (as layer_norm_fwd_wide; a block's slices of them stay in L1):
// kept in registers across the rows, they made the bf16 kernel spill.
template <int K, int CH, class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (CH > 2 ? 1 : OPSMITH_CLUSTER_FWD_BLOCKS)) OPSMITH_CLUSTER_DIMS(K)
layer_norm_fwd_cluster(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                       A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                       int has_b) {
    OPSMITH_SLICE_SETUP
    OPSMITH_CLUSTER_RED(1)
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b);
    Raw in[1][C];
    OPSMITH_CL_X(in, (long long)(blockIdx.x / K))
    OPSMITH_CL_ROWS(rows) {
        const long long base = row * cols + off;
        Raw nx[1][C];
        OPSMITH_CL_X(nx, row + groups)
        A p[4] = {A(0), A(0), A(0), A(0)};
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) p[k & 3] += OPSMITH_E(in[0], c, k);
        A s[1] = {row_allreduce<true>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr)};
        cluster_sum<K>(s, cl_slot_, cl_bar_, cl_round_);
        const A mu = s[0] / A(cols);
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = A(0);
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A d = OPSMITH_IN(c, k) ? OPSMITH_E(in[0], c, k) - mu : A(0);
                p[k & 3] += d * d;
            }
        A q[1] = {row_allreduce<true>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr)};
        cluster_sum<K>(q, cl_slot_, cl_bar_, cl_round_);
        const A r = m_rsqrt(q[0] / A(cols) + eps);
        Raw wb[2][C];
        load_chunks<T, 2>({w + off, b + off}, wb, n, vec, tpr, t, (has_w ? 1u : 0u) | (has_b ? 2u : 0u));
        if (off == 0 && t == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                o[k] = (OPSMITH_E(in[0], c, k) - mu) * r;
                if (has_w) o[k] *= OPSMITH_E(wb[0], c, k);
                if (has_b) o[k] += OPSMITH_E(wb[1], c, k);
            }
            store_vec(y + base, OPSMITH_J(c), n, vec, o);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) in[0][c] = nx[0][c];
    }
    cluster_arrive_relaxed();
    cluster_wait();
}

// -- the backwards: persistent clusters, two rows in flight a block -------------------------------------
// this cluster's next rows: grad_y and x of row r_ (zeros past the last row) and its statistics
#define OPSMITH_CL_LOAD(dst, r_, s1, s2, m_out, r_out)                                    \
    {                                                                                   \
        const bool a_ = (r_) < rows;                                                    \
        const long long b_ = (a_ ? (r_) : 0) * (long long)cols + off;                   \
        load_chunks<T, 2>({grad_y + b_, x + b_}, dst, a_ ? n : 0, vec, tpr, t);         \
        m_out = a_ ? s1[r_] : A(0);                                                     \
        r_out = a_ ? s2[r_] : A(0);                                                     \
    }

// this block's columns of a cluster's row of partial sums (`part`: part[cluster] + off)
template <class T, class A>
__device__ __forceinline__ void write_slice(const A* acc, A* __restrict__ part, int n) {
    constexpr int N = Vec<T>::N, C = OPSMITH_ROW_CHUNKS;  // the backwards' chunks
    const int tpr = blockDim.x, t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < C * N; ++i) {
        const long long col = OPSMITH_J(i / N) + i % N;
        if (col < n) part[col] = acc[i];
    }
}

template <int K, class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS) OPSMITH_CLUSTER_DIMS(K)
rms_norm_bwd_cluster(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                     const A* __restrict__ rstd, T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows,
                     int cols, int has_w, int want_w, const T* __restrict__ grad_res, int has_res) {
    constexpr int CH = OPSMITH_ROW_CHUNKS;
    OPSMITH_SLICE_SETUP
    OPSMITH_CLUSTER_RED(1)
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x) &&
                     (!has_res || aligned16(grad_res));
    Raw wr_[1][C];
    load_chunks<T, 1>({w + off}, wr_, n, vec, tpr, t, has_w ? 1u : 0u);
    A dw[C * N];
#pragma unroll
    for (int i = 0; i < C * N; ++i) dw[i] = A(0);
    Raw in[2][C];
    A unused, r_nx;
    OPSMITH_CL_LOAD(in, (long long)(blockIdx.x / K), rstd, rstd, unused, r_nx)
    OPSMITH_CL_ROWS(rows) {
        const long long base = row * cols + off;
        const A r = r_nx;
        Raw nx[2][C];
        OPSMITH_CL_LOAD(nx, row + groups, rstd, rstd, unused, r_nx)
        Raw res_[1][C];  // add_rms_norm: the gradient that reached the new residual
        load_chunks<T, 1>({grad_res + base}, res_, n, vec, tpr, t, has_res ? 1u : 0u);
        A d = A(0);
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A g = OPSMITH_E(in[0], c, k), v = OPSMITH_E(in[1], c, k);
                dw[c * N + k] += g * v * r;  // padding: g is 0
                d += (has_w ? g * OPSMITH_E(wr_[0], c, k) : g) * v;
            }
        A dd[1] = {row_allreduce(d, SumOp(), A(0), tpr)};
        cluster_sum<K>(dd, cl_slot_, cl_bar_, cl_round_);
        d = dd[0] / A(cols);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A g = OPSMITH_E(in[0], c, k), v = OPSMITH_E(in[1], c, k);
                o[k] = r * ((has_w ? g * OPSMITH_E(wr_[0], c, k) : g) - v * r * r * d);
                if (has_res) o[k] += OPSMITH_E(res_[0], c, k);
            }
            store_vec(grad_x + base, OPSMITH_J(c), n, vec, o);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            in[0][c] = nx[0][c];
            in[1][c] = nx[1][c];
        }
    }
    if (want_w) write_slice<T>(dw, dw_part + (blockIdx.x / K) * (long long)cols + off, n);
    cluster_arrive_relaxed();
    cluster_wait();
}

// layer_norm's cluster backward; RES (layer_norm_bwd_cluster_res, add_layer_norm's): grad_res, the gradient that
// reached the new residual, added to grad_x
template <int K, bool RES, class T, class A>
__device__ __forceinline__ void layer_norm_bwd_cluster_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                            const T* __restrict__ w, const A* __restrict__ mean,
                                                            const A* __restrict__ rstd, T* __restrict__ grad_x,
                                                            A* __restrict__ dw_part, A* __restrict__ db_part,
                                                            long long rows, int cols, int has_w, int want_w,
                                                            int want_b, const T* __restrict__ grad_res) {
    constexpr int CH = OPSMITH_ROW_CHUNKS;
    OPSMITH_SLICE_SETUP
    OPSMITH_CLUSTER_RED(2)
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x) &&
                     (!RES || aligned16(grad_res));
    Raw wr_[1][C];
    load_chunks<T, 1>({w + off}, wr_, n, vec, tpr, t, has_w ? 1u : 0u);
    A dw[C * N], db[C * N];
#pragma unroll
    for (int i = 0; i < C * N; ++i) dw[i] = db[i] = A(0);
    Raw in[2][C];
    A m_nx, r_nx;
    OPSMITH_CL_LOAD(in, (long long)(blockIdx.x / K), mean, rstd, m_nx, r_nx)
    OPSMITH_CL_ROWS(rows) {
        const long long base = row * cols + off;
        const A mu = m_nx, r = r_nx;
        Raw nx[2][C];
        OPSMITH_CL_LOAD(nx, row + groups, mean, rstd, m_nx, r_nx)
        Raw res_[1][RES ? C : 1];
        if constexpr (RES) load_chunks<T, 1>({grad_res + base}, res_, n, vec, tpr, t);
        A s[2] = {A(0), A(0)};
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A g = OPSMITH_E(in[0], c, k), xh = (OPSMITH_E(in[1], c, k) - mu) * r;
                const A gw = has_w ? g * OPSMITH_E(wr_[0], c, k) : g;
                dw[c * N + k] += g * xh;  // padding: g is 0
                db[c * N + k] += g;
                s[0] += gw;
                s[1] += gw * xh;
            }
        row_allreduce_sum2(s[0], s[1], tpr);
        cluster_sum<K>(s, cl_slot_, cl_bar_, cl_round_);
        const A s1 = s[0] / A(cols), s2 = s[1] / A(cols);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A g = OPSMITH_E(in[0], c, k), xh = (OPSMITH_E(in[1], c, k) - mu) * r;
                o[k] = r * ((has_w ? g * OPSMITH_E(wr_[0], c, k) : g) - s1 - xh * s2);
                if constexpr (RES) o[k] += OPSMITH_E(res_[0], c, k);
            }
            store_vec(grad_x + base, OPSMITH_J(c), n, vec, o);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            in[0][c] = nx[0][c];
            in[1][c] = nx[1][c];
        }
    }
    if (want_w) write_slice<T>(dw, dw_part + (blockIdx.x / K) * (long long)cols + off, n);
    if (want_b) write_slice<T>(db, db_part + (blockIdx.x / K) * (long long)cols + off, n);
    cluster_arrive_relaxed();
    cluster_wait();
}

template <int K, class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS) OPSMITH_CLUSTER_DIMS(K)
layer_norm_bwd_cluster(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                       const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                       A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w,
                       int want_w, int want_b) {
    layer_norm_bwd_cluster_rows<K, false>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w,
                                          want_w, want_b, (const T*)nullptr);
}

template <int K, class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS) OPSMITH_CLUSTER_DIMS(K)
layer_norm_bwd_cluster_res(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                           const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                           A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w,
                           int want_w, int want_b, const T* __restrict__ grad_res) {
    layer_norm_bwd_cluster_rows<K, true>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w,
                                         want_w, want_b, grad_res);
}
