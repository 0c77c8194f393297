// opsmith.ops: the persistent norm backwards' rows (norm.cu's layer_norm_bwd*, rms_norm_bwd*: their kernels and
// the math are there): the weight-gradient sums, the weight row, the partial-sum writes, the two-rows-in-flight
// loads, and one row loop each for layer_norm and rms_norm at CH chunks a thread.
#pragma once
#include "rows.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
// blocks of OPSMITH_ROW_THREADS an SM must hold at once in the persistent backwards: 1, so up to
// 128 registers a thread (two rows in flight, see OPSMITH_BWD_LOAD); their launch plan
// (_launch_bwd.norm_bwd_plan) puts OPSMITH_ROW_THREADS * this many threads on an SM. The forwards read w
// and b with x, but layer_norm_fwd_wide (after the reductions; rms_norm_fwd lost by it, fwd-late-params.json).
#ifndef OPSMITH_ROW_BWD_BLOCKS
#define OPSMITH_ROW_BWD_BLOCKS 1
#endif

namespace opsmith {

// The backwards' weight (and bias) gradients: each thread adds its columns' terms of every row it
// visits; at the end the blockDim.y rows of a block meet in shared memory (all values at once: one
// barrier, then every thread sums some columns) and the block writes one row of partial sums,
// part[blockIdx.x][cols], which the caller adds up. grad and x are read once. Blocks of several
// rows hold at most OPSMITH_BWD_BLOCK threads (_launch_bwd.norm_bwd_plan). A grid of one block (`direct`:
// few narrow rows) writes its sums as the gradient itself, in T, and no norm_col_sum launch follows
// (the two launches made a 1 x 64 backward 1.3x eager's time).
#define OPSMITH_BWD_BLOCK 256
// The most threads a row of the *_bwd_sm kernels (norm.cu: __launch_bounds__(this, 2), so 96 registers a thread on
// sm_90, where the 2-chunk persistent backwards take up to 114 (bf16) and one block of 288-320 threads an SM;
// _launch_bwd.norm_bwd_sm_plan)
#ifndef OPSMITH_BWD_SM_THREADS
#define OPSMITH_BWD_SM_THREADS 320
#endif
// A thread's weight-gradient sums in the persistent backwards: K registers, or (SM: the 4-chunk backwards, whose
// registers hold the next row, and the *_bwd_sm kernels, which leave registers for two blocks an SM) K slots of the
// dynamic shared memory, [i][thread] (OPSMITH_ROW_THREADS threads: a stride known at compile time), a thread's own, no
// bank conflicts.
template <class A, int K, bool SM>
struct GradSums {
    A r[SM ? 1 : K];
    A* s;
    __device__ __forceinline__ explicit GradSums(A* smem) : s(smem) {
#pragma unroll
        for (int i = 0; i < K; ++i) (*this)[i] = A(0);
    }
    __device__ __forceinline__ A& operator[](int i) {
        if constexpr (SM) return s[i * OPSMITH_ROW_THREADS + threadIdx.x];
        else return r[i];
    }
};

// A thread's chunks of the weight in the persistent backwards, as loaded (zeros where has_w = 0 and past the row):
// C registers, or (SM) C 16-byte slots of the dynamic shared memory from `smem`, [chunk][thread], a thread's own. SM
// takes whole aligned vectors (vec).
template <class T, int C, bool SM>
struct WeightRow {
    Raw r_[1][SM ? 1 : C];
    Raw* s;
    __device__ __forceinline__ WeightRow(const T* __restrict__ w, Raw* smem, long long cols, bool vec, int has_w)
        : s(smem) {
        const int tpr = blockDim.x, t = threadIdx.x;
        if constexpr (SM) {
            constexpr int N = Vec<T>::N;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                Raw z = {{0u, 0u, 0u, 0u}};
                if (has_w && OPSMITH_J(c) < cols) z = *reinterpret_cast<const Raw*>(w + OPSMITH_J(c));
                s[c * OPSMITH_ROW_THREADS + t] = z;
            }
        } else {
            load_chunks<T, 1>({w}, r_, cols, vec, tpr, t, has_w ? 1u : 0u);
        }
    }
    __device__ __forceinline__ typename Elem<T>::acc operator()(int c, int k) const {
        if constexpr (SM) return raw_get<T>(s[c * OPSMITH_ROW_THREADS + threadIdx.x], k);
        else return raw_get<T>(r_[0][c], k);
    }
};

template <class T, int C = OPSMITH_ROW_CHUNKS, bool ONE = (C != OPSMITH_ROW_CHUNKS), class A, class Acc>
__device__ __forceinline__ void write_partial(Acc& acc, A* __restrict__ part, T* __restrict__ direct, int cols) {
    constexpr int N = Vec<T>::N, K = C * N;
    const int tpr = blockDim.x, t = threadIdx.x, ny = blockDim.y;
    A* out = part + blockIdx.x * (long long)cols;
    auto put = [&](long long col, A v) {
        if (direct) direct[col] = Elem<T>::store(v);
        else out[col] = v;
    };
    if (ny == 1) {
#pragma unroll
        for (int i = 0; i < K; ++i)
            if (OPSMITH_COL(i) < cols) put(OPSMITH_COL(i), acc[i]);
        return;
    }
    if constexpr (ONE) {  // a row a block (norm_bwd_c4_plan, norm_bwd_sm_plan): no shared buffer
        __trap();
    } else {
    if (tpr * ny > OPSMITH_BWD_BLOCK) __trap();  // a plan this buffer does not hold
    __shared__ A red[OPSMITH_BWD_BLOCK * K];      // [row][value][thread]
    __syncthreads();  // an earlier call's readers are done with it
#pragma unroll
    for (int i = 0; i < K; ++i) red[(threadIdx.y * K + i) * tpr + t] = acc[i];
    __syncthreads();
    for (int s = threadIdx.y * tpr + t; s < K * tpr; s += ny * tpr) {
        const int i = s / tpr, tt = s % tpr;
        A v = A(0);
        for (int yy = 0; yy < ny; ++yy) v += red[(yy * K + i) * tpr + tt];
        const long long col = (long long)((i / N) * tpr + tt) * N + i % N;  // OPSMITH_COL(i) of thread tt
        if (col < cols) put(col, v);
    }
    }
}

// The persistent backwards' row loop: every thread runs the same trips, rows past the end idle.
#define OPSMITH_ROW_LOOP                                                                   \
    for (long long row0 = blockIdx.x * (long long)blockDim.y; row0 < rows;                 \
         row0 += (long long)gridDim.x * blockDim.y)

// The persistent backwards' loads: each trip loads the next trip's rows of grad_y and x (and their
// statistics s1, s2: mean and rstd, or rstd twice) before it uses its own: two rows in flight a
// thread. H200 (bench/diag_norm_bwd.py, ops-bwd-h200-2026-11-26/sweep.json, 26 cases): 0.98-1.34x
// (median 1.2x) the best one-row-a-trip build at any grid, with up to 128 registers a thread.
#define OPSMITH_BWD_LOAD(dst, r_, s1, s2, m_out, r_out)                                     \
    {                                                                                    \
        const bool a_ = (r_) < rows;                                                     \
        const long long q_ = a_ ? bwd_row(r_, rows) : 0, b_ = q_ * (long long)cols;      \
        load_chunks<T, 2>({grad_y + b_, x + b_}, dst, a_ ? cols : 0, vec, tpr, t);       \
        m_out = a_ ? s1[q_] : A(0);                                                      \
        r_out = a_ ? s2[q_] : A(0);                                                      \
    }
#define OPSMITH_BWD_FIRST(s1, s2)                                                        \
    Raw in[2][C]; /* this trip's grad_y and x as loaded */                               \
    A m_nx, r_nx;                                                                        \
    OPSMITH_BWD_LOAD(in, blockIdx.x * (long long)blockDim.y + threadIdx.y, s1, s2, m_nx, r_nx)
#define OPSMITH_BWD_NEXT(s1, s2)                                                         \
    const A m_now = m_nx, r_now = r_nx;                                                  \
    Raw nx[2][C]; /* the next trip's */                                                  \
    OPSMITH_BWD_LOAD(nx, row + (long long)gridDim.x * blockDim.y, s1, s2, m_nx, r_nx)
#define OPSMITH_BWD_ROTATE                                                               \
    _Pragma("unroll") for (int c_ = 0; c_ < C; ++c_) {                                   \
        in[0][c_] = nx[0][c_];                                                           \
        in[1][c_] = nx[1][c_];                                                           \
    }

// layer_norm's persistent backward; RES (layer_norm_bwd_res, add_layer_norm's): grad_res, the gradient that reached
// the new residual, added to grad_x
template <class T, class A, bool RES, int CH = OPSMITH_ROW_CHUNKS, bool SMS = false>
__device__ __forceinline__ void layer_norm_bwd_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                    const T* __restrict__ w, const A* __restrict__ mean,
                                                    const A* __restrict__ rstd, T* __restrict__ grad_x,
                                                    A* __restrict__ dw_part, A* __restrict__ db_part, long long rows,
                                                    int cols, int has_w, int want_w, int want_b,
                                                    T* __restrict__ grad_w, T* __restrict__ grad_b, int direct,
                                                    const T* __restrict__ grad_res) {
    constexpr int N = Vec<T>::N, C = CH;
    // the 4-chunk rows and SMS (the *_bwd_sm kernels): the sums and the weight in shared memory, a row a block
    constexpr bool SM = C != OPSMITH_ROW_CHUNKS || SMS;
    const int tpr = blockDim.x, t = threadIdx.x;
    const bool aligned = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x) &&
                         (!RES || aligned16(grad_res));
    if (SM && !aligned) __trap();  // norm_bwd_c4_plan, norm_bwd_sm_plan: whole aligned vectors only
    const bool vec = SM || aligned;
    A* smem = reinterpret_cast<A*>(opsmith_dyn_smem);
    GradSums<A, C * N, SM> dw(smem), db(smem + C * N * OPSMITH_ROW_THREADS);
    const WeightRow<T, C, SM> wr(w, reinterpret_cast<Raw*>(smem + 2 * C * N * OPSMITH_ROW_THREADS), cols, vec, has_w);
    OPSMITH_BWD_FIRST(mean, rstd)
    OPSMITH_ROW_LOOP {
        const long long row = row0 + threadIdx.y;
        const bool active = row < rows;
        const long long n = active ? cols : 0, base = (active ? bwd_row(row, rows) : 0) * (long long)cols;
        OPSMITH_BWD_NEXT(mean, rstd)
        const A mu = m_now, r = r_now;
        Raw(&gr)[C] = in[0];
        Raw(&xr)[C] = in[1];
        Raw res_[1][RES ? C : 1];
        if constexpr (RES) load_chunks<T, 1>({grad_res + base}, res_, n, vec, tpr, t);
        A s1 = A(0), s2 = A(0);
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A g = OPSMITH_E(gr, c, k), xh = (OPSMITH_E(xr, c, k) - mu) * r;
                const A gw = has_w ? g * wr(c, k) : g;
                dw[c * N + k] += g * xh;  // padding and idle rows: g is 0
                db[c * N + k] += g;
                s1 += gw;
                s2 += gw * xh;
            }
        row_allreduce_sum2(s1, s2, tpr);
        s1 /= A(cols);
        s2 /= A(cols);
        if (active) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = OPSMITH_E(gr, c, k), xh = (OPSMITH_E(xr, c, k) - mu) * r;
                    o[k] = r * ((has_w ? g * wr(c, k) : g) - s1 - xh * s2);
                    if constexpr (RES) o[k] += OPSMITH_E(res_[0], c, k);
                }
                store_vec(grad_x + base, OPSMITH_J(c), n, vec, o);
            }
        }
        OPSMITH_BWD_ROTATE
    }
    direct = direct && gridDim.x == 1;
    if (want_w) write_partial<T, C, SM>(dw, dw_part, direct ? grad_w : nullptr, cols);
    if (want_b) write_partial<T, C, SM>(db, db_part, direct ? grad_b : nullptr, cols);
}

// rms_norm's persistent backward (and add_rms_norm's: has_res)
template <class T, class A, int CH = OPSMITH_ROW_CHUNKS, bool SMS = false>
__device__ __forceinline__ void rms_norm_bwd_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                  const T* __restrict__ w, const A* __restrict__ rstd,
                                                  T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows,
                                                  int cols, int has_w, int want_w, const T* __restrict__ grad_res,
                                                  int has_res, T* __restrict__ grad_w, int direct) {
    constexpr int N = Vec<T>::N, C = CH;
    constexpr bool SM = C != OPSMITH_ROW_CHUNKS || SMS;  // as layer_norm's
    const int tpr = blockDim.x, t = threadIdx.x;
    const bool aligned = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x) &&
                         (!has_res || aligned16(grad_res));
    if (SM && !aligned) __trap();
    const bool vec = SM || aligned;
    A* smem = reinterpret_cast<A*>(opsmith_dyn_smem);
    GradSums<A, C * N, SM> dw(smem);
    const WeightRow<T, C, SM> wr(w, reinterpret_cast<Raw*>(smem + C * N * OPSMITH_ROW_THREADS), cols, vec, has_w);
    OPSMITH_BWD_FIRST(rstd, rstd)
    OPSMITH_ROW_LOOP {
        const long long row = row0 + threadIdx.y;
        const bool active = row < rows;
        const long long n = active ? cols : 0, base = (active ? bwd_row(row, rows) : 0) * (long long)cols;
        OPSMITH_BWD_NEXT(rstd, rstd)
        const A r = r_now;
        Raw(&gr)[C] = in[0];
        Raw(&xr)[C] = in[1];
        Raw res_[1][C];  // add_rms_norm: the gradient that reached the new residual, added to grad_x
        load_chunks<T, 1>({grad_res + base}, res_, n, vec, tpr, t, has_res ? 1u : 0u);
        A d = A(0);
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A g = OPSMITH_E(gr, c, k), v = OPSMITH_E(xr, c, k);
                dw[c * N + k] += g * v * r;  // padding and idle rows: g is 0
                d += (has_w ? g * wr(c, k) : g) * v;
            }
        d = row_allreduce(d, SumOp(), A(0), tpr) / A(cols);
        if (active) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                A o[N];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = OPSMITH_E(gr, c, k), v = OPSMITH_E(xr, c, k);
                    o[k] = r * ((has_w ? g * wr(c, k) : g) - v * r * r * d);
                    if (has_res) o[k] += OPSMITH_E(res_[0], c, k);
                }
                store_vec(grad_x + base, OPSMITH_J(c), n, vec, o);
            }
        }
        OPSMITH_BWD_ROTATE
    }
    if (want_w) write_partial<T, C, SM>(dw, dw_part, direct && gridDim.x == 1 ? grad_w : nullptr, cols);
}

}  // namespace opsmith
