// opsmith.ops softmax over the last dimension: y = exp(x - max) / sum(exp(x - max)), and its
// backward grad_x = y * (grad_y - sum(grad_y * y)). Rows of `cols` elements, `rows` of them.
//
// Three strategies (opsmith/ops/_launch.py's softmax_plan picks one from the row length and the device):
//  * softmax_fwd / softmax_bwd: the row lives in registers. A block is (tpr, rows per block):
//    tpr threads share a row, each holding OPSMITH_ROW_CHUNKS vectors of 16 bytes. tpr <= 32
//    is the one-warp-per-row path (several rows per block, shuffles only); tpr > 32 holds one
//    row per block and meets in shared memory. One read and one write of the row: the floor.
//  * softmax_fwd_wide / softmax_bwd_wide: the same with OPSMITH_WIDE_CHUNKS vectors a thread and
//    up to OPSMITH_LONG_THREADS threads, for rows the first cannot hold (bf16 up to 32,768);
//    softmax_fwd_wide3 the forward's rows of OPSMITH_WIDE3_THREADS threads, at 3 blocks an SM.
//  * softmax_fwd_long / softmax_bwd_long: longer rows. One block per row (grid-stride over rows).
//    The forward is the online softmax: one pass keeps a running (max, sum), rescaling the sum
//    when the max grows, a second pass writes. The first pass copies the row into shared memory
//    when the launch gave enough (`cache` = 1), so that the second reads it from there.
// Numerics: the max is subtracted before exp (no overflow); sums in float (double for double);
// exp as exp2 (m_expe; the register forwards flush subnormal results: m_exp2_ftz). The register
// forward keeps two reductions: one reduction of each thread's (max, sum of exp) merged online ran
// 35-41 % slower on an H100 (exp twice an element, and in merges).
// A NaN anywhere in a row, +inf, or a row of only -inf give a row of NaN, as in torch.
#include "rows.cuh"
#include "softmax_bwd.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
#ifndef OPSMITH_LONG_THREADS
#define OPSMITH_LONG_THREADS 1024
#endif
#ifndef OPSMITH_WIDE_CHUNKS
#define OPSMITH_WIDE_CHUNKS 4  // 16-byte chunks a thread in softmax_fwd_wide (_launch.WIDE_CHUNKS)
#endif
#ifndef OPSMITH_WIDE3_THREADS
#define OPSMITH_WIDE3_THREADS 512  // softmax_fwd_wide3's threads a block (_launch.WIDE3_THREADS)
#endif

namespace opsmith {

// (max, sum of exp(x - max)) of two parts of a row, as one.
template <class A> __device__ __forceinline__ void online_merge(A& m, A& s, A m2, A s2) {
    const A mm = m_max(m, m2);
    const A a = m == neg_inf<A>() ? A(0) : s * m_expe(m - mm);  // exp(-inf - -inf) would be NaN
    const A b = m2 == neg_inf<A>() ? A(0) : s2 * m_expe(m2 - mm);
    m = mm;
    s = a + b;
}

template <class A> __device__ __forceinline__ void online_allreduce(A& m, A& s, int tpr) {
    __shared__ A pm[32], ps[32];
    const int width = tpr < 32 ? tpr : 32;
    for (int o = width >> 1; o > 0; o >>= 1)
        online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (tpr <= 32) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { pm[warp] = m; ps[warp] = s; }
    __syncthreads();
    m = lane < (tpr >> 5) ? pm[lane] : neg_inf<A>();
    s = lane < (tpr >> 5) ? ps[lane] : A(0);
    for (int o = 16; o > 0; o >>= 1)
        online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// exp(x - m) as exp2: (F) x log2e - m log2e in one fma (ml = m log2e, finite), else (x - m) log2e
template <bool F, class A> __device__ __forceinline__ A softmax_e(A x, A m, A ml) {
    if constexpr (F) return m_exp2_ftz(fmaf(x, log2e<A>(), -ml));
    else return m_exp2_ftz((x - m) * log2e<A>());
}
template <class T> using A_of = typename Elem<T>::acc;

}  // namespace opsmith

using namespace opsmith;

// One row of the register forward, C chunks a thread, bounds checks as mode M (rows.cuh's RowMode).
// The max and the sum of a thread's elements go into 4 partials each (chains of 4, not C * N).
template <int M, int C, class T>
__device__ __forceinline__ void softmax_fwd_row(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    const long long row = blockIdx.x * (long long)blockDim.y + threadIdx.y;
    const bool active = row < rows;  // idle rows still take part in the reductions
    const int n = active ? cols : 0;
    const long long base = (active ? row : 0) * (long long)cols;
    Raw in[1][C];
    load_chunks<T, 1>({x + base}, in, n, M != ROW_SCALAR, tpr, t);
    A v[C * N], p[4] = {neg_inf<A>(), neg_inf<A>(), neg_inf<A>(), neg_inf<A>()};
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int j = (c * tpr + t) * N;
#pragma unroll
        for (int k = 0; k < N; ++k) {
            v[c * N + k] = in_row<M>(j, k, n) ? raw_get<T>(in[0][c], k) : neg_inf<A>();
            p[k & 3] = m_max(p[k & 3], v[c * N + k]);
        }
    }
    const A m = row_allreduce<(C >= 4)>(m_max(m_max(p[0], p[1]), m_max(p[2], p[3])), MaxOp(), neg_inf<A>(), tpr);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = A(0);
#pragma unroll
    for (int i = 0; i < C * N; ++i) {
        v[i] = m_exp2_ftz((v[i] - m) * log2e<A>());  // padding is -inf: adds 0
        p[i & 3] += v[i];
    }
    const A r = A(1) / row_allreduce<(C >= 4)>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr);
#pragma unroll
    for (int i = 0; i < C * N; ++i) v[i] *= r;
    if (active) {
#pragma unroll
        for (int c = 0; c < C; ++c) store_vals<M>(y + base, (c * tpr + t) * N, n, v + c * N);
    }
}

// the element-wise row (unaligned or odd widths) out of line, so that its registers do not
// weigh on the vector paths (inlined, it made the bf16 kernel spill)
template <int C, class T>
__device__ __noinline__ void softmax_fwd_scalar(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_row<ROW_SCALAR, C>(x, y, rows, cols);
}

template <int C, class T>
__device__ __forceinline__ void softmax_fwd_any(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    const int mode = row_mode<T, C>(cols % Vec<T>::N == 0 && aligned16(x) && aligned16(y), cols);
    if (mode == ROW_FULL) softmax_fwd_row<ROW_FULL, C>(x, y, rows, cols);
    else if (mode == ROW_VEC) softmax_fwd_row<ROW_VEC, C>(x, y, rows, cols);
    else softmax_fwd_scalar<C>(x, y, rows, cols);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 4, 4>::value))
softmax_fwd(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_any<OPSMITH_ROW_CHUNKS>(x, y, rows, cols);
}

// softmax_fwd's rows where x and y are 16-byte aligned and cols fills the threads' chunks exactly (the caller's
// test: _launch.full_rows): the unchecked row alone, without the other modes' code and the element path's
// stack. H100, L2 flushed (bench/diag_softmax_full.py): 0.07-0.16 us less a call, bf16 1x64 4.86 -> 4.70 us
// (torch eager 4.74).
template <class T>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 4, 4>::value))
softmax_fwd_full(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_row<ROW_FULL, OPSMITH_ROW_CHUNKS>(x, y, rows, cols);
}

// The register forward for rows too long for OPSMITH_ROW_THREADS threads of OPSMITH_ROW_CHUNKS
// chunks and short enough for OPSMITH_LONG_THREADS of OPSMITH_WIDE_CHUNKS (bf16 up to 32,768: the
// row read once, into registers, one block a row, as Liger's), where softmax_fwd_long takes two
// passes and an online rescale (_launch.softmax_plan's "wide" strategy). C = 8: float rows of 16,385-32,768 (64
// registers, no spills; the backward's spill 132 bytes, ptxas sm_90), where the long kernels read them twice.
template <class T, int C>  // C: OPSMITH_WIDE_CHUNKS, or 8
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS, 1)
softmax_fwd_wide(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_any<C>(x, y, rows, cols);
}

// softmax_fwd_wide's rows of up to OPSMITH_C4_THREADS that fill their chunks, x and y aligned (_launch.full_rows):
// the unchecked row alone, 47 registers (4 blocks an SM) where the three modes take 64. H100 diag_full_rows.py.
#define OPSMITH_C4_THREADS 256  // norm.cu's, _launch.C4_THREADS
template <class T>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, 4)
softmax_fwd_wide_full(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_row<ROW_FULL, OPSMITH_WIDE_CHUNKS>(x, y, rows, cols);
}

// The wide forward's row for blocks of OPSMITH_WIDE3_THREADS at 3 blocks an SM (40 registers a thread):
// the chunks stay packed as loaded (raw_get converts an element where it is used) and each exp is
// computed twice, for the sum and for the output, instead of held. The kernel is issue-bound: 16-bit
// rows take exp2(x log2e - m log2e) (one fma) where |m| < 1e38 (m log2e finite), else, as float and
// double always, exp2((x - m) log2e) (softmax_fwd_row's, the same results). Measured on an H200
// (bench/results/ops-gated-h200-2026-11-26/, softmax-occ.txt and wide3*.txt, L2 flushed).
template <int M, int C, class T, bool F>
__device__ __forceinline__ void softmax_rc_out(Raw (&in)[1][C], T* __restrict__ y, int n, bool active, A_of<T> m,
                                               int tpr, int t) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const A ml = m * log2e<A>();
    A p[4] = {A(0), A(0), A(0), A(0)};
    reconvert(in);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int j = (c * tpr + t) * N;
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (in_row<M>(j, k, n)) p[k & 3] += softmax_e<F>(raw_get<T>(in[0][c], k), m, ml);
    }
    const A r = A(1) / row_allreduce<true>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr);
    if (!active) return;
    reconvert(in);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        A v[N];
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = softmax_e<F>(raw_get<T>(in[0][c], k), m, ml) * r;
        store_vals<M>(y, (c * tpr + t) * N, n, v);
    }
}

template <int M, int C, class T>
__device__ __forceinline__ void softmax_fwd_row_rc(const T* __restrict__ x, T* __restrict__ y, long long rows,
                                                   int cols) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    const long long row = blockIdx.x;  // one row a block (the wide plans)
    const bool active = row < rows;  // idle rows still take part in the reductions
    const int n = active ? cols : 0;
    const long long base = (active ? row : 0) * (long long)cols;
    Raw in[1][C];
    load_chunks<T, 1>({x + base}, in, n, M != ROW_SCALAR, tpr, t);
    A p[4] = {neg_inf<A>(), neg_inf<A>(), neg_inf<A>(), neg_inf<A>()};
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int j = (c * tpr + t) * N;
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (in_row<M>(j, k, n)) p[k & 3] = m_max(p[k & 3], raw_get<T>(in[0][c], k));
    }
    const A m = row_allreduce<true>(m_max(m_max(p[0], p[1]), m_max(p[2], p[3])), MaxOp(), neg_inf<A>(), tpr);
    if (sizeof(T) == 2 && fabs(m) < A(1e38))  // the same m in every thread of the row: one branch
        softmax_rc_out<M, C, T, sizeof(T) == 2>(in, y + base, n, active, m, tpr, t);
    else
        softmax_rc_out<M, C, T, false>(in, y + base, n, active, m, tpr, t);
}

template <int C, class T>
__device__ __noinline__ void softmax_fwd_scalar_rc(const T* __restrict__ x, T* __restrict__ y, long long rows,
                                                   int cols) {
    softmax_fwd_row_rc<ROW_SCALAR, C>(x, y, rows, cols);
}

// softmax_fwd_wide for rows of OPSMITH_WIDE3_THREADS threads or fewer (_launch.softmax_fwd_wide3; the plans give
// it the wide rows of exactly that many: bf16 8,193-16,384 wide, float 4,097-8,192, and the rows of whole warps of
// 257-511 threads, _launch._whole_warps'). softmax_fwd_wide3_full takes the rows that fill their threads' chunks
// (cols == blockDim.x * OPSMITH_WIDE_CHUNKS * N): compiled beside
// the checked rows' path, their path spilled and ran 0.84-0.91x softmax_fwd_wide; alone, it has no spills and
// runs 1.07-1.12x (bf16 4096x16384 3,442 -> 3,853 GB/s, Liger 3,669; bench/results/ops-gated-h200-2026-11-26/
// w3full.txt).
template <class T>
__global__ void __launch_bounds__(OPSMITH_WIDE3_THREADS, 3)
softmax_fwd_wide3(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    constexpr int C = OPSMITH_WIDE_CHUNKS;
    if (cols % Vec<T>::N == 0 && aligned16(x) && aligned16(y)) softmax_fwd_row_rc<ROW_VEC, C>(x, y, rows, cols);
    else softmax_fwd_scalar_rc<C>(x, y, rows, cols);
}

// x and y 16-byte aligned and cols exactly the threads' chunks: the caller's (no test here: the call to the
// element path, compiled in, made this kernel spill)
template <class T>
__global__ void __launch_bounds__(OPSMITH_WIDE3_THREADS, 3)
softmax_fwd_wide3_full(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    softmax_fwd_row_rc<ROW_FULL, OPSMITH_WIDE_CHUNKS>(x, y, rows, cols);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, 1)
softmax_bwd(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x, long long rows,
            int cols) {
    softmax_bwd_any<OPSMITH_ROW_CHUNKS>(grad_y, y, grad_x, rows, cols);
}

// softmax_bwd for softmax_fwd_wide's rows (_launch.softmax_plan's "wide"): grad_y and y read once.
template <class T, int C>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS, 1)
softmax_bwd_wide(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x, long long rows,
                 int cols) {
    softmax_bwd_any<C>(grad_y, y, grad_x, rows, cols);
}

// softmax_bwd_wide with grad_y staged in shared memory (_launch.softmax_plan's "wide" of WIDE8_CHUNKS with
// shared_mem: float rows of 32,768 that fill the chunks, one row a block). Rows that do not fill them, or
// unaligned, take the checked rows (without staging).
template <class T, int C>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS, 1)
softmax_bwd_wide_sm(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x, long long rows,
                    int cols) {
    const bool vec = cols % Vec<T>::N == 0 && aligned16(grad_y) && aligned16(y) && aligned16(grad_x);
    if (vec && blockDim.y == 1 && cols == C * Vec<T>::N * (int)blockDim.x) {
        if (blockIdx.x < rows) softmax_bwd_row_staged<C>(grad_y, y, grad_x, rows, cols);  // a block a row
    } else if (vec) {
        softmax_bwd_checked<ROW_VEC, C>(grad_y, y, grad_x, rows, cols);
    } else {
        softmax_bwd_checked<ROW_SCALAR, C>(grad_y, y, grad_x, rows, cols);
    }
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
softmax_fwd_long(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols, int cache) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    T* sm = reinterpret_cast<T*>(opsmith_dyn_smem);
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y);
    // a thread reads back from shared memory only what it wrote there itself: no barrier needed
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        A m = neg_inf<A>(), s = A(0);
        for (long long j = (long long)t * N; j < cols; j += (long long)tpr * N) {
            A v[N];
            load_row(xr, sm, cache ? 1 : 0, j, cols, vec, v, neg_inf<A>());
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A e = v[k];
                if (e > m) {  // a new max: rescale what was summed so far
                    s = s * m_expe(m - e) + A(1);
                    m = e;
                } else if (e != neg_inf<A>()) {  // -inf adds 0 (also when m is -inf); NaN adds NaN
                    s += m_expe(e - m);
                }
            }
        }
        online_allreduce(m, s, tpr);
        if (m == pos_inf<A>()) s = m - m;  // torch: exp(inf - inf) is NaN, so is the whole row
        const A r = A(1) / s;
        for (long long j = (long long)t * N; j < cols; j += (long long)tpr * N) {
            A v[N];
            load_row(xr, sm, cache ? 2 : 0, j, cols, vec, v, neg_inf<A>());
#pragma unroll
            for (int k = 0; k < N; ++k) v[k] = m_expe(v[k] - m) * r;
            store_vec(y + row * cols, j, cols, vec, v);
        }
    }
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_LONG_THREADS)
softmax_bwd_long(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x, long long rows,
                 int cols, int cache) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const int tpr = blockDim.x, t = threadIdx.x;
    // the cache holds grad_y, then y (each padded to 16 bytes)
    T* smg = reinterpret_cast<T*>(opsmith_dyn_smem);
    T* smy = smg + ((cols * sizeof(T) + 15) / 16) * 16 / sizeof(T);
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(y) && aligned16(grad_x);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long long base = row * cols;
        A dot = A(0);
        for (long long j = (long long)t * N; j < cols; j += (long long)tpr * N) {
            A g[N], p[N];
            load_row(grad_y + base, smg, cache ? 1 : 0, j, cols, vec, g, A(0));
            load_row(y + base, smy, cache ? 1 : 0, j, cols, vec, p, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) dot += g[k] * p[k];
        }
        dot = row_allreduce(dot, SumOp(), A(0), tpr);
        for (long long j = (long long)t * N; j < cols; j += (long long)tpr * N) {
            A g[N], p[N];
            load_row(grad_y + base, smg, cache ? 2 : 0, j, cols, vec, g, A(0));
            load_row(y + base, smy, cache ? 2 : 0, j, cols, vec, p, A(0));
#pragma unroll
            for (int k = 0; k < N; ++k) g[k] = p[k] * (g[k] - dot);
            store_vec(grad_x + base, j, cols, vec, g);
        }
    }
}
