// opsmith.ops: what the register-row kernels (softmax.cu, norm.cu, fused_norm.cu) share beyond
// common.cuh: their register caps, bounds checks by mode, stores, rms_norm's inf check, setup.
#pragma once
#include "common.cuh"

namespace opsmith {

// The minimum blocks of OPSMITH_ROW_THREADS (512) threads an SM must hold at once for a register-row
// kernel, by element size (`__launch_bounds__`' second argument: the registers a thread may use,
// 128 / 64 / 42 / 32 for 1 / 2 / 3 / 4). Measured per kernel on an H200 with bench/diag_row_fwd.py
// (bench/results/ops-bwd-h200-2026-11-26/fwd.json): the forwards' default of 58-60 registers held
// 1,024 threads an SM, too few loads in flight for its bandwidth; 3 gave rms_norm_fwd (bf16) +25 % at
// 8192 x 8192, while layer_norm_fwd spills at 3. 8-byte types keep 1 (correct, not tuned).
template <class T, int B16, int B32>
struct RowBlocks {
    static constexpr int value = sizeof(T) == 8 ? 1 : sizeof(T) == 4 ? B32 : B16;
};

// -- the register-row forwards: bounds checks by what the launch guarantees ---------------------
// ROW_FULL: 16-byte access and every chunk of every thread inside the row (cols == C * N * tpr, the
// power-of-two widths): no check at all; ROW_VEC: 16-byte access, a chunk wholly inside the row or
// wholly past its end: one check a chunk; ROW_SCALAR: element access, one check an element. The
// kernels compile their row once per mode and pick one at run time: the checks of ROW_SCALAR on
// every element (64-bit compares and selects) were most of the forwards' instructions at 16-bit
// widths, where an SM must finish about 4 elements a cycle to keep up with HBM.
enum RowMode { ROW_SCALAR = 0, ROW_VEC = 1, ROW_FULL = 2 };

// element k of the chunk starting at column j is inside a row of n elements
template <int M> __device__ __forceinline__ bool in_row(int j, int k, int n) {
    return M == ROW_FULL ? true : M == ROW_VEC ? j < n : j + k < n;
}

// N values to elements j .. j+N-1 of a row of n, rounded to T (checks as in_row<M>; ROW_FULL
// checks nothing: the caller stores active rows only)
template <int M, class T, class A> __device__ __forceinline__ void store_vals(T* row, int j, int n, const A* in) {
    constexpr int N = Vec<T>::N;
    if (M != ROW_SCALAR) {
        if (M == ROW_FULL || j < n) *reinterpret_cast<Raw*>(row + j) = raw_pack<T>(in);
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (j + k < n) row[j + k] = Elem<T>::store(in[k]);
    }
}

// the mode of this launch's rows: vec = 16-byte access allowed (cols % N == 0, pointers aligned)
template <class T, int C = OPSMITH_ROW_CHUNKS> __device__ __forceinline__ int row_mode(bool vec, int cols) {
    return !vec ? ROW_SCALAR : cols == C * Vec<T>::N * (int)blockDim.x ? ROW_FULL : ROW_VEC;
}

// a 16-byte chunk of T holds an inf or a NaN (on the bits: a conversion to float per element would
// be shared with the caller's later use of the same elements and keep them all live)
template <class T> __device__ __forceinline__ bool raw_nonfinite(const Raw& r) {
    bool any = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned u = r.u[i];
        if constexpr (sizeof(T) == 2) {
            const unsigned e = sizeof(T) == 2 && Elem<T>::is_bf16 ? 0x7f80u : 0x7c00u;  // exponent all ones
            any |= (u & 0x7fffu) >= e || ((u >> 16) & 0x7fffu) >= e;
        } else if constexpr (sizeof(T) == 4) {
            any |= (u & 0x7fffffffu) >= 0x7f800000u;
        } else if (i & 1) {
            any |= (u & 0x7fffffffu) >= 0x7ff00000u;  // the high word of a double
        }
    }
    return any;
}

// rms_norm's sum of squares q of a row (every thread of the row holds it) is +inf when a square
// overflowed or when the row holds an inf; the row must be NaN in the second case only (as an inf
// or NaN makes every norm's row NaN; a NaN makes q NaN by itself). Called after the row's y and
// rstd were written from q (rstd 0, y 0 or NaN), so that nothing of the row stays live for it: where
// q is inf somewhere in the warp (tpr <= 32: several rows a warp, every lane takes part in the
// shuffles) or in the block's one row, this thread's C chunks of x (`xr`: the row, n elements; 0:
// an idle row) are read again, and a row holding an inf is overwritten with NaN, rstd too.
template <class T, int C = OPSMITH_ROW_CHUNKS>
__device__ __forceinline__ void rms_inf_rows(typename Elem<T>::acc q, const T* __restrict__ xr, T* __restrict__ yr,
                                             typename Elem<T>::acc* rstd_row, int n, int tpr) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const bool inf = q == pos_inf<A>();
    if (!(tpr <= 32 ? __any_sync(0xffffffffu, inf) : inf)) return;
    const int t = threadIdx.x;
    int any = 0;
    for (int c = 0; c < C; ++c)
        for (int k = 0; k < N; ++k) {
            const int j = (c * tpr + t) * N + k;
            if (j < n) {
                Raw r = {{0u, 0u, 0u, 0u}};
                raw_put<T>(r, 0, xr[j]);
                any |= raw_nonfinite<T>(r) ? 1 : 0;
            }
        }
    if (tpr > 32) {
        any = __syncthreads_or(any);  // one row a block
    } else {
        for (int o = tpr >> 1; o > 0; o >>= 1) any |= __shfl_xor_sync(0xffffffffu, any, o);
    }
    if (!any || !inf) return;
    const A nan = nonfinite(q);  // inf - inf
    for (int c = 0; c < C; ++c)
        for (int k = 0; k < N; ++k) {
            const int j = (c * tpr + t) * N + k;
            if (j < n) yr[j] = Elem<T>::store(nan);
        }
    if (t == 0) *rstd_row = nan;
}

// A thread's chunks of the same row of K arrays, as loaded (chunk c holds columns
// (c * tpr + t) * N .. + N; past the row's end, and for an array whose bit in `on` is clear:
// zeros). Every load is issued before any value is used, so that all of a thread's loads are in
// flight together: the vector decision is made once for all of them (`vec`: n % N == 0 and every
// pointer aligned, so a chunk is wholly inside the row or wholly past it). Loading chunk by chunk
// through a per-chunk helper compiled (cuobjdump, sm_90) into a branch per chunk holding its load
// and the unpacking that waits for it: one 16-byte load in flight per thread at a time.
template <class T, int K, int C>
__device__ __forceinline__ void load_chunks(const T* const (&src)[K], Raw (&dst)[K][C], long long n, bool vec,
                                            int tpr, int t, unsigned on = ~0u) {
    constexpr int N = Vec<T>::N;
    if (vec) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const long long j = (long long)(c * tpr + t) * N;
#pragma unroll
            for (int s = 0; s < K; ++s) {
                Raw z = {{0u, 0u, 0u, 0u}};
                if (j < n && ((on >> s) & 1u)) z = *reinterpret_cast<const Raw*>(src[s] + j);
                dst[s][c] = z;
            }
        }
    } else {
        const T zero = Elem<T>::store(typename Elem<T>::acc(0));
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const long long j = (long long)(c * tpr + t) * N;
#pragma unroll
            for (int s = 0; s < K; ++s) {
                Raw z = {{0u, 0u, 0u, 0u}};
#pragma unroll
                for (int k = 0; k < N; ++k) raw_put<T>(z, k, (j + k < n && ((on >> s) & 1u)) ? src[s][j + k] : zero);
                dst[s][c] = z;
            }
        }
    }
}

// chunk `c` of a thread's register row back to memory (as load_chunks: wholly or not at all when vec)
template <class T>
__device__ __forceinline__ void store_chunk(T* row, long long j, long long n, bool vec, const Raw& in) {
    constexpr int N = Vec<T>::N;
    if (vec) {
        if (j < n) *reinterpret_cast<Raw*>(row + j) = in;
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (j + k < n) row[j + k] = raw_elem<T>(in, k);
    }
}

// The packed words "changed" (an empty asm that may change them): the elements are converted again where
// next used instead of held converted from an earlier pass, so only the chunks as loaded stay live across a
// reduction (held, the 32 floats of a bf16 thread spilled: 200 bytes in softmax_fwd_wide3, and the backward's
// wide kernel of 4 chunks at 64 registers).
template <int K, int C> __device__ __forceinline__ void reconvert(Raw (&in)[K][C]) {
#pragma unroll
    for (int a = 0; a < K; ++a)
#pragma unroll
        for (int c = 0; c < C; ++c)
            asm volatile("" : "+r"(in[a][c].u[0]), "+r"(in[a][c].u[1]), "+r"(in[a][c].u[2]), "+r"(in[a][c].u[3]));
}

// -- thread-block clusters (sm_90+: norm_cluster.cu) --------------------------------------------
// A cluster of K blocks shares one row; each block sums its slice, then the blocks read each other's
// sums from distributed shared memory. Below sm_90 the helpers trap: the launch plans never pick the
// cluster kernels there (DeviceProps.clusters).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define OPSMITH_CLUSTER_DIMS(k) __cluster_dims__(k, 1, 1)
#define OPSMITH_HAS_CLUSTERS 1
#else
#define OPSMITH_CLUSTER_DIMS(k)
#define OPSMITH_HAS_CLUSTERS 0
#endif

// this block's rank in its cluster
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
#if OPSMITH_HAS_CLUSTERS
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
// every thread of the cluster's blocks arrives (its memory writes released) ...
__device__ __forceinline__ void cluster_arrive() {
#if OPSMITH_HAS_CLUSTERS
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
    __trap();
#endif
}
// ... (or arrives without ordering anything: at a kernel's end, so that no block exits while its
// sends may be in flight)
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if OPSMITH_HAS_CLUSTERS
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
// ... and waits for all the others (their writes acquired)
__device__ __forceinline__ void cluster_wait() {
#if OPSMITH_HAS_CLUSTERS
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// a generic pointer to shared memory as a 32-bit shared-window address, and that address in the
// shared memory of the cluster's block `rank`
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a = 0;
#if OPSMITH_HAS_CLUSTERS
    asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(p));
#endif
    return a;
}
__device__ __forceinline__ unsigned cluster_map(unsigned a, unsigned rank) {
    unsigned r = 0;
#if OPSMITH_HAS_CLUSTERS
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
#endif
    return r;
}
// v into the cluster-window address `remote`, completing sizeof(v) bytes of the mbarrier at `bar`
__device__ __forceinline__ void st_async(unsigned remote, float v, unsigned bar) {
#if OPSMITH_HAS_CLUSTERS
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 :: "r"(remote), "r"(__float_as_uint(v)), "r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void st_async(unsigned remote, double v, unsigned bar) {
#if OPSMITH_HAS_CLUSTERS
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 :: "r"(remote), "l"(__double_as_longlong(v)), "r"(bar) : "memory");
#endif
}

// The cluster reductions' shared state (OPSMITH_CLUSTER_RED in a kernel with K and A in scope): two
// mbarriers and two rounds of slots, [round][sender's rank][value], used by reductions alternately.
// Initialised once, then the whole cluster meets (cluster_red_init) before any block sends.
#define OPSMITH_CLUSTER_RED(W)                            \
    __shared__ __align__(8) unsigned long long cl_bar_[2]; \
    __shared__ A cl_slot_[2][K][W];                       \
    cluster_red_init(cl_bar_);                            \
    int cl_round_ = 0;

__device__ __forceinline__ void cluster_red_init(unsigned long long (&bar)[2]) {
#if OPSMITH_HAS_CLUSTERS
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&bar[0])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&bar[1])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
    cluster_arrive();
    cluster_wait();
}

// The sums (cluster_sum), or any reduction `op` (cluster_reduce), over a cluster's K blocks of W
// values (every thread of a block holds its block's: after row_allreduce), the same in every block
// (combined in rank order). Thread b of each block sends the block's values into block b's slots
// with st.async, which completes block b's mbarrier of this round; each block waits on its own
// mbarrier (armed for K * W values) and combines. No cluster-wide barrier a reduction: a first
// version met at `barrier.cluster.arrive.release` (which also orders the block's earlier global
// stores) and ran 1.2-1.35x slower on an H200 (with a cluster a row forward;
// bench/results/ops-cluster-h200-2026-11-26/diag-v1.json). Every block of the cluster must run the
// same sequence of reductions (`round` counts them). A round's slots are written again two rounds
// later, which a block reaches only after every block has sent it the round between, so after its
// reads. (One exchange a row instead of two, merging each slice's (max, sum of exps) or (sum,
// squared deviations), measured no faster: diag-one-exchange.json.)
template <int K, int W, class A, class Op>
__device__ __forceinline__ void cluster_reduce(A (&v)[W], A (&slot)[2][K][W], unsigned long long (&bar)[2],
                                               int& round, Op op) {
    const int p = round & 1;
    const unsigned t = threadIdx.x + threadIdx.y * blockDim.x;
#if OPSMITH_HAS_CLUSTERS
    const unsigned parity = (round >> 1) & 1;
#endif
    ++round;
    const unsigned b = smem_u32(&bar[p]);
#if OPSMITH_HAS_CLUSTERS
    if (t == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(b), "r"((unsigned)(K * W * sizeof(A))) : "memory");
#endif
    if (t < K) {
        const unsigned rb = cluster_map(b, t), me = cluster_rank();
#pragma unroll
        for (int i = 0; i < W; ++i) st_async(cluster_map(smem_u32(&slot[p][me][i]), t), v[i], rb);
    }
#if OPSMITH_HAS_CLUSTERS
    unsigned done = 0;
    do {
        asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
    } while (!done);
#endif
#pragma unroll
    for (int i = 0; i < W; ++i) {
        A s = slot[p][0][i];
#pragma unroll
        for (int r = 1; r < K; ++r) s = op(s, slot[p][r][i]);
        v[i] = s;
    }
}
template <int K, int W, class A>
__device__ __forceinline__ void cluster_sum(A (&v)[W], A (&slot)[2][K][W], unsigned long long (&bar)[2], int& round) {
    cluster_reduce<K>(v, slot, bar, round, SumOp());
}

}  // namespace opsmith

// The register-row kernels' setup (norm.cu, fused_norm.cu): a block of blockDim.y rows, tpr =
// blockDim.x threads a row, C chunks of N elements per thread.
#define OPSMITH_ROW_SETUP OPSMITH_ROW_SETUP_C(OPSMITH_ROW_CHUNKS)
#define OPSMITH_ROW_SETUP_C(CC) OPSMITH_ROW_SETUP_AT(CC, blockIdx.x)
#define OPSMITH_ROW_SETUP_AT(CC, BLK) /* BLK: the block's index among the blocks of rows */ \
    typedef typename Elem<T>::acc A_;                                              \
    constexpr int N = Vec<T>::N, C = (CC);                                         \
    const int tpr = blockDim.x, t = threadIdx.x;                                   \
    const long long row = (BLK) * (long long)blockDim.y + threadIdx.y;             \
    const bool active = row < rows; /* idle rows still take part in reductions */  \
    const int n = active ? cols : 0;                                               \
    const long long base = (active ? row : 0) * (long long)cols;

// The register-row kernels keep a thread's chunks as loaded (Raw, in T) and convert each element
// where it is used (for 16-bit types half the registers of floats). Chunk c of a thread starts at
// column (c * tpr + t) * N: OPSMITH_J(c); element k of chunk c of array a: OPSMITH_E(a, c, k).
#define OPSMITH_J(c) ((long long)((c) * tpr + t) * N)
#define OPSMITH_E(a, c, k) raw_get<T>((a)[c], k)

// element i of a thread's register row (chunk i / N, lane i % N) is column col(i)
#define OPSMITH_COL(i) ((long long)(((i) / N) * tpr + t) * N + (i) % N)

// The cluster kernels' (norm_cluster.cu, softmax_cluster.cu) setup, with K (blocks a cluster) and CH
// (16-byte chunks a thread) in scope: this block's slice of a row, columns off .. off + n of it
// (n = 0 past the row's end) ...
#define OPSMITH_SLICE_SETUP                                                                   \
    constexpr int N = Vec<T>::N, C = CH;                                                      \
    const int tpr = blockDim.x, t = threadIdx.x;                                              \
    const int off = (int)cluster_rank() * C * N * tpr;                                        \
    const int n = cols - off <= 0 ? 0 : (cols - off < C * N * tpr ? cols - off : C * N * tpr);
// ... and their persistent loop: this cluster's rows
#define OPSMITH_CL_ROWS(nrows)                                                            \
    const long long g0 = blockIdx.x / K, groups = gridDim.x / K;                          \
    for (long long row = g0; row < (nrows); row += groups)
