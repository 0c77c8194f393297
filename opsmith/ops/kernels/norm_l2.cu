// opsmith.ops LayerNorm, RMSNorm, add + RMSNorm and add + LayerNorm forwards in two passes over a row held in L2 (the
// "l2" strategy of opsmith/ops/_launch_norm.py's norm_l2_plan): one block a row, one 16-byte chunk a
// thread a trip (U chunks with their loads issued together), few registers, so that an SM holds 2,048
// threads. The first pass reads the row asking L2 to keep it (evict_last) and sums it; the second reads
// it again, from L2 (the row was read a moment before: the rows in flight are a few MiB), asking L2 to
// let it go first (evict_first), and writes y. HBM sees one read and one write of the row, as in the
// register rows, at a fraction of their registers: the register rows of 16,384 bf16 elements held one
// 512-thread block an SM (or a 2-block cluster a row), too few bytes in flight. Widths a multiple of 16
// bytes, 16-byte-aligned pointers (the plan's condition).
//
// layer_norm's variance: each thread keeps the exact mean and squared deviations of its chunks merged
// one chunk at a time (Chan et al.), the block then adds the threads' sums for the mean and their
// squared deviations about it (each thread's plus its count times its mean's distance from the row's):
// as exact as the register rows' two passes, with no data-dependent shift (a shifted one-pass sum
// failed the hard-rows GPU test).
#include "common.cuh"

#ifndef OPSMITH_L2_THREADS
#define OPSMITH_L2_THREADS 1024  // the most threads a block (_launch.L2_THREADS)
#endif
// 16-byte chunks a thread a trip, their loads issued together. H200 (bench/diag_norm_l2.py,
// bench/results/ops-norm-l2-h200-2026-11-26/variants.txt): 2 ran 1.05-1.45x as fast as 1 and 1.1-1.5x as 4;
// 32 registers a thread (2,048 threads an SM) beat 64 by 5-30 % but for fp32 at 8192x8192 (even).
#ifndef OPSMITH_L2_UNROLL  // a diag script's other count (bench/diag_fwd_l2_trips.py)
#define OPSMITH_L2_UNROLL 2
#endif
// Each kernel's first template argument B: the blocks of OPSMITH_L2_THREADS an SM (__launch_bounds__). B = 2 as
// above; B = 1 for rows past _launch.L2_ONE_ROW_BYTES, up to 64 registers and twice the chunks in flight
// (OPSMITH_L2_UNROLL_ONE, _launch.L2_ONE_CHUNKS); its 48-64 registers keep a second block out (two such rows an SM
// overflowed L2 before their second pass; tests/ops/test_ops_compile.py checks the count). H100
// (bench/results/ops-fp32-rows-h100-2026-11-27/l2one.json), fp32 2048x32768 GB/s: rms_norm 2,546 (one block, 2
// chunks) -> 2,728, layer_norm 2,261 (two blocks) -> 2,549, add_rms_norm 2,738 -> 2,828; 8 chunks ran no faster
// (add_rms_norm spilled).
#ifndef OPSMITH_L2_UNROLL_ONE  // a diag script's other count (bench/diag_fwd_128k.py)
#define OPSMITH_L2_UNROLL_ONE 4
#endif
// The first pass's chunks a trip of layer_norm's and rms_norm's kernels of B = 1: its loads come from HBM and it holds
// no weights, so 8 fit in 64 registers unspilled (the second pass, with the weights' chunks, keeps
// OPSMITH_L2_UNROLL_ONE: at 8 it spilled). The kernels of B = 1 of layer_norm take their threads a row as the constant
// OPSMITH_L2_THREADS (norm_l2_plan launches them with no other count: the U loads' offsets fold into the
// instructions); rms_norm's ran slower so. H200 (bench/diag_fwd_128k.py, bench/results/ops-h200-2026-12-04/after.json),
// GB/s against 4 chunks and the threads read from blockDim, one run: fp32 2048x32768 rms_norm 3,561 -> 3,807,
// layer_norm 3,269 -> 3,403; 4096x32768 rms_norm 3,656 -> 3,870, layer_norm 3,390 -> 3,463; bf16 2048x65536 rms_norm
// 3,576 -> 3,841, layer_norm 3,097 -> 3,289 (rms_norm with the constant: 2-4 % below without).
#ifndef OPSMITH_L2_FIRST_ONE
#define OPSMITH_L2_FIRST_ONE 8
#endif
// add_rms_norm's and add_layer_norm's (B = 1): their first pass's chunks a trip of x and of residual each (8 loads in
// flight, 62-64 registers unspilled; the second pass keeps OPSMITH_L2_UNROLL_ONE / 2). H200 (bench/diag_fwd_128k.py,
// bench/results/ops-h200-2026-12-04/add.json), GB/s against 2, one run: bf16 2048x65536 add_layer_norm 3,663 -> 3,778,
// add_rms_norm 3,824 -> 3,841; fp32 2048x32768 3,734 -> 3,772 and 3,817 -> 3,838; 4096x32768 as fast (3,761 -> 3,772,
// 3,819 -> 3,834).
#ifndef OPSMITH_L2_ADD_FIRST_ONE
#define OPSMITH_L2_ADD_FIRST_ONE 4
#endif
// B = 3 (layer_norm's and rms_norm's, _launch_norm.norm_l2_plan's rows of more than 16 up to 32 KiB where the device's
// DRAM bandwidth an SM is high): blocks of up to OPSMITH_L2_THREADS_THREE threads, 3 an SM (40 registers), and
// OPSMITH_L2_UNROLL_THREE chunks a trip in both passes, so that a row of 512 threads takes one trip a pass (as
// torch.compile's Triton kernel for fp32 65536x8192: one program of 16 warps a row, R0_BLOCK 8192). H200
// (bench/diag_fwd_l2_trips.py, bench/results/ops-h200-2026-12-04/trips.txt), GB/s against B = 2 (2 chunks a trip, 4
// blocks of 512 an SM at 32 registers), one run: fp32 rms_norm 65536x8192 4,067 -> 4,275, 8192x8192 4,050 -> 4,180,
// layer_norm 32768x8192 4,171 -> 4,259; bf16 rms_norm 16384x16384 4,121 -> 4,257. bf16 layer_norm ran 0.98-1.00x
// (it keeps B = 2), rows of 16 KiB (2 chunks a thread) as fast, and 4 chunks a trip at 32 registers (B = 4, or 1,024
// threads) spilled and ran 0.7-1.0x.
#define OPSMITH_L2_THREADS_THREE 512
#define OPSMITH_L2_UNROLL_THREE 4
// the kernels' __launch_bounds__: B blocks of OPSMITH_L2_THREADS (of OPSMITH_L2_THREADS_THREE where B = 3) an SM
#define OPSMITH_L2_BOUNDS __launch_bounds__(B == 3 ? OPSMITH_L2_THREADS_THREE : OPSMITH_L2_THREADS, B)
#ifndef OPSMITH_L2_ONE_WFIRST  // 0: B = 1 loads its weights as B = 2 (a diag variant: 0.89-0.96x, weights-late.txt)
#define OPSMITH_L2_ONE_WFIRST 1
#endif
#ifndef OPSMITH_L2_LN_FIXED  // 0 or 1 (a diag script's variants)
#define OPSMITH_L2_LN_FIXED 1
#endif
#ifndef OPSMITH_L2_RMS_FIXED
#define OPSMITH_L2_RMS_FIXED 0
#endif

namespace opsmith {

// 16 bytes at p under L2 policy `pol` (without the hints: 1-6 % slower on 12 of 15 bf16 and fp32
// shapes, up to 3 % faster on the others; same run)
__device__ __forceinline__ Raw ld_l2(const void* p, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    Raw r;
    asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(pol));
    return r;
#else
    return *reinterpret_cast<const Raw*>(p);
#endif
}

// ld_l2 of memory this kernel stored (st_l2): ordered after those stores
__device__ __forceinline__ Raw ld_l2_own(const void* p, unsigned long long pol) {
    Raw r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(pol) : "memory");
#else
    asm volatile("" ::: "memory");
    r = *reinterpret_cast<const volatile Raw*>(p);
#endif
    return r;
}
// 16 bytes to p under L2 policy `pol`
__device__ __forceinline__ void st_l2(void* p, const Raw& r, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                 :: "l"(p), "r"(r.u[0]), "r"(r.u[1]), "r"(r.u[2]), "r"(r.u[3]), "l"(pol) : "memory");
#else
    *reinterpret_cast<Raw*>(p) = r;
#endif
}

}  // namespace opsmith

using namespace opsmith;

// A block's row (one a block: norm_l2_plan takes up to 2^31 - 1 rows; a grid-stride loop over rows took
// registers past the 32 and ran 10-30 % slower), its setup, and the trips of a thread over the row's nv
// chunks: chunk c0 + u * tpr for u < U (FIXED: tpr the constant OPSMITH_L2_THREADS where B = 1)
#define OPSMITH_L2_ROW(FIXED) \
    OPSMITH_L2_ROW_U(B == 1 ? OPSMITH_L2_UNROLL_ONE : B == 3 ? OPSMITH_L2_UNROLL_THREE : OPSMITH_L2_UNROLL, FIXED)
#define OPSMITH_L2_ROW_U(UU, FIXED)                                          \
    constexpr int N = Vec<T>::N, U = (UU);                                    \
    const int tpr = B == 1 && (FIXED) ? OPSMITH_L2_THREADS : (int)blockDim.x; \
    const int t = threadIdx.x, nv = cols / N;                                 \
    const unsigned long long keep = l2_keep(), first = l2_first();            \
    const long long row = blockIdx.x;
#define OPSMITH_L2_TRIPS OPSMITH_L2_TRIPS_U(U)
#define OPSMITH_L2_TRIPS_U(UU) for (int c0 = t; c0 < nv; c0 += (UU) * tpr)
#define OPSMITH_L2_IN(u) (c0 + (u) * tpr < nv)
// The second pass's weights (w, b) of a trip's U chunks into wr[U] where B = 1, their loads issued with the row's,
// before the math, under L2 evict_last (every row reads them). Loaded chunk by chunk after the math of the chunk
// before, as B = 2 keeps them (32 registers), each waited for its own trip to L2: ptxas kept the loads there. H100
// (bench/results/ops-l2-weights-h100-2026-11-27/ln3.json), GB/s, fp32 2048x32768: layer_norm 2,546 -> 2,677, rms_norm
// 2,697 -> 2,774; bf16 2048x65536 layer_norm 2,490 -> 2,608. At B = 2 as fast or 1 % slower, or spilling.
#define OPSMITH_L2_WEIGHTS_FIRST(wr, w, has)                                                         \
    if constexpr (B == 1 && OPSMITH_L2_ONE_WFIRST) {                                                 \
        _Pragma("unroll") for (int u = 0; u < U; ++u)                                                \
            wr[u] = has && OPSMITH_L2_IN(u) ? ld_l2(w + (long long)(c0 + u * tpr) * N, keep) : Raw{}; \
    }
#define OPSMITH_L2_LOAD(r, pol) OPSMITH_L2_LOAD_U(r, pol, U)
#define OPSMITH_L2_LOAD_U(r, pol, UU)                                                                   \
    Raw r[UU];                                                                                          \
    _Pragma("unroll") for (int u = 0; u < (UU); ++u)                                                    \
        if (OPSMITH_L2_IN(u)) r[u] = ld_l2(xr + (long long)(c0 + u * tpr) * N, pol);

// One 16-byte chunk merged into a thread's exact mean and squared deviations (mu, m2) of the cnt chunks before
// (Chan et al.: the chunk's own mean and deviations, then the two merged)
template <class T, class A>
__device__ __forceinline__ void chan_merge(const Raw& r, A& mu, A& m2, int& cnt) {
    constexpr int N = Vec<T>::N;
    A s = A(0);
#pragma unroll
    for (int k = 0; k < N; ++k) s += raw_get<T>(r, k);
    const A cm = s * (A(1) / A(N));
    A q = A(0);
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const A d = raw_get<T>(r, k) - cm;
        q += d * d;
    }
    ++cnt;
    const A f = A(1) / A(cnt), delta = cm - mu;
    mu += delta * f;
    m2 += q + delta * delta * (A(N) * A(cnt - 1) * f);
}

// layer_norm's statistics from the threads' (mu, m2) over their cnt chunks: the row's mean and rstd, written by
// thread 0
template <class T, class A>
__device__ __forceinline__ void ln_row_stats(A mu, A m2, int cnt, int cols, A eps, int tpr, int t, long long row,
                                             A* __restrict__ mean, A* __restrict__ rstd, A& mu_row, A& rs) {
    constexpr int N = Vec<T>::N;
    const A n_t = A(N) * A(cnt);
    mu_row = row_allreduce<true>(mu * n_t, SumOp(), A(0), tpr) / A(cols);
    const A dm = mu - mu_row;
    const A var = row_allreduce<true>(m2 + n_t * dm * dm, SumOp(), A(0), tpr) / A(cols);
    rs = m_rsqrt(var + eps);
    if (t == 0) {
        mean[row] = mu_row;
        rstd[row] = rs;
    }
}

// layer_norm's and add_layer_norm's second pass: y = (v - mu) * rs (* w) (+ b) over the row at src, read back from
// L2 under `first` (OWN: a row this kernel stored, read after those stores); B as the kernels'
template <int B, int U, bool OWN, class T, class A>
__device__ __forceinline__ void ln_scale_pass(const T* src, const T* __restrict__ w, const T* __restrict__ b,
                                              T* __restrict__ yr, A mu_row, A rs, int has_w, int has_b, int nv,
                                              int tpr, int t, unsigned long long first, unsigned long long keep) {
    constexpr int N = Vec<T>::N;
    OPSMITH_L2_TRIPS {
        Raw r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const T* p = src + (long long)(c0 + u * tpr) * N;
            if (OPSMITH_L2_IN(u)) r[u] = OWN ? ld_l2_own(p, first) : ld_l2(p, first);
        }
        Raw wr[U], br[U];
        OPSMITH_L2_WEIGHTS_FIRST(wr, w, has_w)
        OPSMITH_L2_WEIGHTS_FIRST(br, b, has_b)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
            const int j = (c0 + u * tpr) * N;
            if constexpr (!(B == 1 && OPSMITH_L2_ONE_WFIRST)) {
                wr[u] = has_w ? *reinterpret_cast<const Raw*>(w + j) : Raw{};
                br[u] = has_b ? *reinterpret_cast<const Raw*>(b + j) : Raw{};
            }
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                A v = (raw_get<T>(r[u], k) - mu_row) * rs;
                if (has_w) v *= raw_get<T>(wr[u], k);
                if (has_b) v += raw_get<T>(br[u], k);
                o[k] = v;
            }
            *reinterpret_cast<Raw*>(yr + j) = raw_pack<T>(o);
        }
    }
}

template <int B, class T, class A>
__global__ void OPSMITH_L2_BOUNDS
layer_norm_fwd_l2(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    OPSMITH_L2_ROW(OPSMITH_L2_LN_FIXED)
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    A mu = A(0), m2 = A(0);
    int cnt = 0;  // chunks merged into (mu, m2)
    constexpr int U1 = B == 1 ? OPSMITH_L2_FIRST_ONE : U;  // the first pass's chunks a trip
    OPSMITH_L2_TRIPS_U(U1) {
        OPSMITH_L2_LOAD_U(r, keep, U1)
#pragma unroll
        for (int u = 0; u < U1; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
            chan_merge<T>(r[u], mu, m2, cnt);
        }
    }
    A mu_row, rs;
    ln_row_stats<T>(mu, m2, cnt, cols, eps, tpr, t, row, mean, rstd, mu_row, rs);
    ln_scale_pass<B, U, false>(xr, w, b, yr, mu_row, rs, has_w, has_b, nv, tpr, t, first, keep);
}

// rms_norm's and add_rms_norm's second pass: y = v * rs (* w) over the row at src, read back from L2 under
// `pol` (OWN: a row this kernel stored, read after those stores); B as the kernels' (OPSMITH_L2_WEIGHTS_FIRST)
template <int B, int U, bool OWN, class T, class A>
__device__ __forceinline__ void rms_scale_pass(const T* src, const T* __restrict__ w, T* __restrict__ yr, A rs,
                                               int has_w, int nv, int tpr, int t, unsigned long long pol,
                                               unsigned long long keep) {
    constexpr int N = Vec<T>::N;
    OPSMITH_L2_TRIPS {
        Raw r[U], wr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const T* p = src + (long long)(c0 + u * tpr) * N;
            if (OPSMITH_L2_IN(u)) r[u] = OWN ? ld_l2_own(p, pol) : ld_l2(p, pol);
        }
        OPSMITH_L2_WEIGHTS_FIRST(wr, w, has_w)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
            const int j = (c0 + u * tpr) * N;
            if constexpr (!(B == 1 && OPSMITH_L2_ONE_WFIRST))
                wr[u] = has_w ? *reinterpret_cast<const Raw*>(w + j) : Raw{};
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = raw_get<T>(r[u], k) * rs;
                o[k] = has_w ? v * raw_get<T>(wr[u], k) : v;
            }
            *reinterpret_cast<Raw*>(yr + j) = raw_pack<T>(o);
        }
    }
}

template <int B, class T, class A>
__global__ void OPSMITH_L2_BOUNDS
rms_norm_fwd_l2(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                long long rows, int cols, A eps, int has_w) {
    OPSMITH_L2_ROW(OPSMITH_L2_RMS_FIXED)
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    A q = A(0);
    constexpr int U1 = B == 1 ? OPSMITH_L2_FIRST_ONE : U;  // the first pass's chunks a trip
    OPSMITH_L2_TRIPS_U(U1) {
        OPSMITH_L2_LOAD_U(r, keep, U1)
#pragma unroll
        for (int u = 0; u < U1; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A v = raw_get<T>(r[u], k);
                q += v * v + nonfinite(v);  // an inf makes the row NaN, as torch's
            }
        }
    }
    const A rs = m_rsqrt(row_allreduce<true>(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (t == 0) rstd[row] = rs;
    rms_scale_pass<B, U, false>(xr, w, yr, rs, has_w, nv, tpr, t, first, keep);
}

// The add norms' first pass: the U chunks a trip of x and residual (their only read, evict_first), s = x + residual
// rounded to T as the residual stream holds it, written to sr asking L2 to keep it for the second pass, and each
// chunk of s handed to visit (the norm's sums)
template <int U, class T, class A, class F>
__device__ __forceinline__ void add_first_pass(const T* __restrict__ xr, const T* __restrict__ rr, T* __restrict__ sr,
                                               int nv, int tpr, int t, unsigned long long first,
                                               unsigned long long keep, F&& visit) {
    constexpr int N = Vec<T>::N;
    OPSMITH_L2_TRIPS {
        OPSMITH_L2_LOAD(a, first)
        Raw b[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (OPSMITH_L2_IN(u)) b[u] = ld_l2(rr + (long long)(c0 + u * tpr) * N, first);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!OPSMITH_L2_IN(u)) break;
            A v[N];
#pragma unroll
            for (int k = 0; k < N; ++k) v[k] = raw_get<T>(a[u], k) + raw_get<T>(b[u], k);
            const Raw p = raw_pack<T>(v);  // rounded to T, as the residual stream holds it
            st_l2(sr + (long long)(c0 + u * tpr) * N, p, keep);
            visit(p);
        }
    }
}

// add_rms_norm's forward (fused_norm.cu's math): the first pass reads x and residual (their only read),
// writes s = x + residual, rounded to T, as the new residual asking L2 to keep it, and sums its squares;
// the second reads s back from L2 and writes y. HBM: x and residual read, s and y written, the floor.
// One chunk of each a trip (two loads in flight, as the others' two chunks): at two it spilled (B = 1: two, and
// OPSMITH_L2_ADD_FIRST_ONE in the first pass).
template <int B, class T, class A>
__global__ void OPSMITH_L2_BOUNDS
add_rms_norm_fwd_l2(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                    T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ rstd, long long rows, int cols,
                    A eps, int has_w) {
    OPSMITH_L2_ROW_U(B == 1 ? OPSMITH_L2_UNROLL_ONE / 2 : 1, false)
    const T* xr = x + row * cols;
    const T* rr = residual + row * cols;
    T* sr = residual_out + row * cols;
    T* yr = y + row * cols;
    A q = A(0);
    add_first_pass<B == 1 ? OPSMITH_L2_ADD_FIRST_ONE : U, T, A>(xr, rr, sr, nv, tpr, t, first, keep, [&](const Raw& p) {
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A e = raw_get<T>(p, k);
            q += e * e + nonfinite(e);  // an inf makes the row NaN, as rms_norm's
        }
    });
    const A rs = m_rsqrt(row_allreduce<true>(q, SumOp(), A(0), tpr) / A(cols) + eps);
    if (t == 0) rstd[row] = rs;
    rms_scale_pass<B, U, true>(sr, w, yr, rs, has_w, nv, tpr, t, first, keep);
}

// add_layer_norm's forward (fused_norm.cu's): the first pass reads x and residual (their only read), writes
// s = x + residual, rounded to T, as the new residual asking L2 to keep it, and merges its statistics; the second
// reads s back from L2 and writes y. HBM: x and residual read, s and y written, the floor.
template <int B, class T, class A>
__global__ void OPSMITH_L2_BOUNDS
add_layer_norm_fwd_l2(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                      const T* __restrict__ b, T* __restrict__ y, T* __restrict__ residual_out, A* __restrict__ mean,
                      A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    OPSMITH_L2_ROW_U(B == 1 ? OPSMITH_L2_UNROLL_ONE / 2 : 1, false)
    const T* xr = x + row * cols;
    const T* rr = residual + row * cols;
    T* sr = residual_out + row * cols;
    T* yr = y + row * cols;
    A mu = A(0), m2 = A(0);
    int cnt = 0;
    add_first_pass<B == 1 ? OPSMITH_L2_ADD_FIRST_ONE : U, T, A>(xr, rr, sr, nv, tpr, t, first, keep,
                                                                [&](const Raw& p) { chan_merge<T>(p, mu, m2, cnt); });
    A mu_row, rs;
    ln_row_stats<T>(mu, m2, cnt, cols, eps, tpr, t, row, mean, rstd, mu_row, rs);
    ln_scale_pass<B, U, true>(sr, w, b, yr, mu_row, rs, has_w, has_b, nv, tpr, t, first, keep);
}
