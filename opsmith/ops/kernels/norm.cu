// opsmith.ops LayerNorm and RMSNorm over the last dimension (rows of `cols` elements).
//
//   layer_norm: y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)  (biased variance)
//   rms_norm:   y = x * rstd * w,               rstd = 1 / sqrt(mean(x^2) + eps)
// The forward saves mean and rstd per row (in the accumulation type) for the backward:
//   layer_norm: grad_x = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),  gw = grad_y * w,
//               xhat = (x - mean) * rstd
//   rms_norm:   grad_x = rstd * (gw - x * rstd^2 * mean(gw * x))  (+ grad_res, add_rms_norm's: has_res)
// grad_w and grad_b are column sums over the rows. The register-row backwards (*_bwd) are
// persistent: their blocks stride over the rows, read grad and x once, add each row's terms into
// per-thread sums and write one row of partial sums a block (part[gridDim.x][cols]), which
// norm_col_sum (norm_split.cu) adds up; after the long-row backwards, norm_bwd_weight's partials.
//
// The strategies are softmax.cu's: the row in registers (*_fwd, *_bwd here; tpr threads per
// row, tpr <= 32 is one warp per row), or one block per long row (*_long, in norm_long.cu) with
// the row copied into shared memory on the first pass when the launch gave room (`cache` = 1).
// The variance is the mean of squared deviations from the mean (two passes over the row), not
// E[x^2] - E[x]^2 (it cancels catastrophically for rows with a large mean); a pairwise merge of each
// thread's (count, mean, squared deviations) ran 13-31 % slower on an H100 (the merges' divisions).
// The shifted-data form, E[d^2] - E[d]^2 with d = x - x[0] in one reduction, was 0.5-6 % faster on
// 16-bit rows (H200) but lost fp16's tolerance on rows whose first element lies far out (its sums
// of d^2 carry the outlier's size; tests/ops/test_ops_gpu.py's hard rows): not kept.
// `has_w` / `has_b` = 0: no weight / bias (the pointer is then any tensor and is not read). An inf
// or NaN in a row makes it NaN, as torch on CUDA: layer_norm by itself (inf - inf), rms_norm by
// rms_inf_rows (mean(x^2) = inf alone would give rstd = 0 and outputs of 0).
#include "norm_fwd.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
// blocks of OPSMITH_ROW_THREADS an SM must hold at once in the persistent backwards: 1, so up to
// 128 registers a thread (two rows in flight, see OPSMITH_BWD_LOAD); their launch plan
// (_launch.norm_bwd_plan) puts OPSMITH_ROW_THREADS * this many threads on an SM. The forwards read w
// and b with x, but layer_norm_fwd_wide (after the reductions; rms_norm_fwd lost by it, fwd-late-params.json).
#ifndef OPSMITH_ROW_BWD_BLOCKS
#define OPSMITH_ROW_BWD_BLOCKS 1
#endif

using namespace opsmith;

// The register-row forwards' rows are norm_fwd.cuh's. The register-row backwards keep a thread's chunks of
// grad, x and the weight as loaded, in T (rows.cuh's OPSMITH_J / OPSMITH_E), room for the weight-gradient sums.

// The forwards of 4 chunks a thread, one row a block of at most OPSMITH_C4_THREADS (layer_norm_fwd_c4,
// rms_norm_fwd_c4; _launch_norm.norm_c4_plan: rows of 2 KiB to 16 KiB in whole 16-byte vectors, 16-bit
// types, and float for layer_norm): half the threads a row of the 2-chunk kernels, so fewer meet in
// each reduction, at up to 85 registers (3 blocks an SM, no spills). H200, kernels alone
// (bench/results/ops-fwd-c4-h200-2026-11-26/): bf16 layer_norm 65536 x 1024 3,208 -> 3,838 GB/s,
// 16384 x 2048 3,008 -> 3,493; rms_norm 16384 x 4096 3,914 -> 4,063; float rms_norm ran as fast either way.
#define OPSMITH_C4_THREADS 256

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
layer_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
               A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
               int has_b) {
    layer_norm_fwd_any<0>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd for rows of 256+ threads with 16-byte access (picked by _launch_norm.layer_norm_kernel
// and osm_ops.cpp): w and b read after the reductions, 3 blocks of 512 threads an SM. H200
// (bench/results/ops-fwd-h200-2026-11-26/fwd-layer-norm-variants.json): bf16 8192 x 8192 2,531 ->
// 2,967 GB/s, fp32 16384 x 4096 2,846 -> 3,614; slower on narrower rows and on the element path (it
// spills there), which layer_norm_fwd keeps. Correct for any row. Since layer_norm_fwd_c4 (2 to 16 KiB
// rows) and the L2 rows (16 KiB and more), which both measured faster, the 2- and 4-byte rows of 256+
// threads in whole vectors take those: this kernel serves float64's.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 3, 3>::value))
layer_norm_fwd_wide(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                    A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                    int has_b) {
    layer_norm_fwd_any<1>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd with 4 chunks a thread (twice the row of one block): fp32 rows of 4,097-8,192 in
// whole vectors (_launch_norm.layer_norm_fwd4_plan), which 2-block clusters served with two cluster
// reductions a row. H200, fp32 8192 x 8192: 2,800 -> 3,909 GB/s (bench/diag_ln_fwd4.py); 16-bit rows
// ran slower this way (bf16 4096 x 16384: 1,948 GB/s against 2,573) and keep the clusters.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
layer_norm_fwd_c4(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_any<1, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd_c4's rows that fill their threads' chunks, every pointer 16-byte aligned (the caller's test:
// _launch.full_rows): the unchecked row alone. H100, L2 flushed (bench/diag_full_rows.py): bf16 1.00-1.02x. w and b
// are read a chunk at a time in the output loop (LATE = 2: 56 registers where reading them all after the reductions
// holds 80; one H100 run, ln_full4w: 4096 x 4096 1.016x, 2048 x 8192 1.006x, 16384 x 4096 0.995x).
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
layer_norm_fwd_c4_full(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                       A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                       int has_b) {
    layer_norm_fwd_row<ROW_FULL, 2, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd's 16-bit rows of 2 to 4 KiB that fill its 2 chunks a thread, every pointer 16-byte aligned
// (_launch_norm.layer_norm_full2_plan, where norm_c4_plan would give them layer_norm_fwd_c4_full): the unchecked row
// alone, w and b read with x, 56 registers (80 at 4 chunks). H100, L2 flushed (bench/diag_full_rows.py, ln_full2
// against the op's c4 kernel, two runs): bf16 2048 x 2048 1.09-1.12x, 2048 x 1024 1.04x, 65536 x 1024 1.01x,
// 16384 x 2048 1.00x, 512 x 1024 0.98x (a 6 us call); from 4 KiB it ran 0.82-0.94x.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
layer_norm_fwd_full(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                    A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                    int has_b) {
    layer_norm_fwd_row<ROW_FULL, 0, T, A>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// The forwards of 8 chunks a thread, one row a block of at most OPSMITH_C4_THREADS, 2 blocks an SM (128
// registers; layer_norm's 16-bit rows spill 152 bytes): rows of 16 to 32 KiB in whole 16-byte vectors of 2- and
// 4-byte types (_launch_norm.norm_c8_plan) in one pass, where the L2 rows (norm_l2.cu) read them twice. H100,
// kernels alone (bench/results/ops-small-bwd-h100-2026-11-27/long1.json), GB/s L2 rows -> these: bf16 rms_norm
// 4096 x 16384 2,869 -> 3,052 (Liger-Kernel 3,046), layer_norm 2,800 -> 2,873; float 8192 x 8192 rms_norm
// 2,889 -> 3,039, layer_norm 2,866 -> 3,014. At 64 KiB (512 threads of 8 chunks) they gained 0.6-2.3 % for
// rms_norm and lost 10 % for bf16 layer_norm (it spills 488 bytes): those rows keep the L2 rows.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, 2)
layer_norm_fwd_c8(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_any<1, T, A, 8>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
layer_norm_fwd4(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_any<0, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// The backwards' weight (and bias) gradients: each thread adds its columns' terms of every row it
// visits; at the end the blockDim.y rows of a block meet in shared memory (all values at once: one
// barrier, then every thread sums some columns) and the block writes one row of partial sums,
// part[blockIdx.x][cols], which the caller adds up. grad and x are read once. Blocks of several
// rows hold at most OPSMITH_BWD_BLOCK threads (_launch.norm_bwd_plan). A grid of one block (`direct`:
// few narrow rows) writes its sums as the gradient itself, in T, and no norm_col_sum launch follows
// (the two launches made a 1 x 64 backward 1.3x eager's time).
#define OPSMITH_BWD_BLOCK 256
// A thread's weight-gradient sums in the persistent backwards: K registers, or (SM: the 4-chunk backwards, whose
// registers hold the next row) K slots of the dynamic shared memory, [i][thread] (OPSMITH_ROW_THREADS threads: a
// stride known at compile time), a thread's own, no bank conflicts.
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

template <class T, int C = OPSMITH_ROW_CHUNKS, class A, class Acc>
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
    if constexpr (C != OPSMITH_ROW_CHUNKS) {  // the 4-chunk backwards: a row a block (norm_bwd_c4_plan)
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
template <class T, class A, bool RES, int CH = OPSMITH_ROW_CHUNKS>
__device__ __forceinline__ void layer_norm_bwd_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                    const T* __restrict__ w, const A* __restrict__ mean,
                                                    const A* __restrict__ rstd, T* __restrict__ grad_x,
                                                    A* __restrict__ dw_part, A* __restrict__ db_part, long long rows,
                                                    int cols, int has_w, int want_w, int want_b,
                                                    T* __restrict__ grad_w, T* __restrict__ grad_b, int direct,
                                                    const T* __restrict__ grad_res) {
    constexpr int N = Vec<T>::N, C = CH;
    constexpr bool SM = C != OPSMITH_ROW_CHUNKS;  // the 4-chunk rows: the sums and the weight in shared memory
    const int tpr = blockDim.x, t = threadIdx.x;
    const bool aligned = cols % N == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x) &&
                         (!RES || aligned16(grad_res));
    if (SM && !aligned) __trap();  // norm_bwd_c4_plan: whole aligned vectors only
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
    if (want_w) write_partial<T, C>(dw, dw_part, direct ? grad_w : nullptr, cols);
    if (want_b) write_partial<T, C>(db, db_part, direct ? grad_b : nullptr, cols);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS)
layer_norm_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
               const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
               A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w, int want_w,
               int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct) {
    layer_norm_bwd_rows<T, A, false>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w, want_w,
                                     want_b, grad_w, grad_b, direct, nullptr);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS)
layer_norm_bwd_res(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                   const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                   A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w, int want_w,
                   int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct,
                   const T* __restrict__ grad_res) {
    layer_norm_bwd_rows<T, A, true>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w, want_w,
                                    want_b, grad_w, grad_b, direct, grad_res);
}


template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 3, 3>::value))
rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
             long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_any(x, w, y, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
rms_norm_fwd_c4(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_any<T, A, 4>(x, w, y, rstd, rows, cols, eps, has_w);
}

// rms_norm_fwd_c4's full rows, as layer_norm_fwd_c4_full's: bf16 1.00-1.04x (bench/diag_full_rows.py). At 4 blocks of
// 256 an SM (63 registers, no spills, where 3 give 72) it read 1.00-1.012x in one run and 0.996-1.012x in the next
// (bench/results/ops-c4-bounds-h100-2026-11-27/, rms_full4b): the noise, so the bounds stay
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
rms_norm_fwd_c4_full(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                     long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_row<ROW_FULL, T, A, 4>(x, w, y, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, 2)
rms_norm_fwd_c8(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_any<T, A, 8>(x, w, y, rstd, rows, cols, eps, has_w);
}

// rms_norm's persistent backward (and add_rms_norm's: has_res)
template <class T, class A, int CH = OPSMITH_ROW_CHUNKS>
__device__ __forceinline__ void rms_norm_bwd_rows(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                  const T* __restrict__ w, const A* __restrict__ rstd,
                                                  T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows,
                                                  int cols, int has_w, int want_w, const T* __restrict__ grad_res,
                                                  int has_res, T* __restrict__ grad_w, int direct) {
    constexpr int N = Vec<T>::N, C = CH;
    constexpr bool SM = C != OPSMITH_ROW_CHUNKS;  // as layer_norm's
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
    if (want_w) write_partial<T, C>(dw, dw_part, direct && gridDim.x == 1 ? grad_w : nullptr, cols);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS)
rms_norm_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
             const A* __restrict__ rstd, T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows, int cols,
             int has_w, int want_w, const T* __restrict__ grad_res, int has_res, T* __restrict__ grad_w, int direct) {
    rms_norm_bwd_rows<T, A>(grad_y, x, w, rstd, grad_x, dw_part, rows, cols, has_w, want_w, grad_res, has_res,
                            grad_w, direct);
}

// The backwards of 4 chunks a thread (_launch_norm.norm_bwd_c4_plan): a row a block of up to OPSMITH_ROW_THREADS,
// rows twice as long as the 2-chunk kernels' (float 4,097-8,192 columns), which otherwise take two blocks of a
// cluster (norm_cluster.cu) and meet in distributed shared memory each row; one block an SM, the next row's
// grad and x in flight (twice the cluster blocks' bytes an SM).
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, 1)
rms_norm_bwd_c4(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                const A* __restrict__ rstd, T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows, int cols,
                int has_w, int want_w, const T* __restrict__ grad_res, int has_res, T* __restrict__ grad_w,
                int direct) {
    rms_norm_bwd_rows<T, A, 4>(grad_y, x, w, rstd, grad_x, dw_part, rows, cols, has_w, want_w, grad_res, has_res,
                               grad_w, direct);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, 1)
layer_norm_bwd_c4(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                  const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                  A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w, int want_w,
                  int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct) {
    layer_norm_bwd_rows<T, A, false, 4>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w,
                                        want_w, want_b, grad_w, grad_b, direct, nullptr);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, 1)
layer_norm_bwd_c4_res(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                      const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                      A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w,
                      int want_w, int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct,
                      const T* __restrict__ grad_res) {
    layer_norm_bwd_rows<T, A, true, 4>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w,
                                       want_w, want_b, grad_w, grad_b, direct, grad_res);
}
