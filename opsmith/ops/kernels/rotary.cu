// opsmith.ops rotary position embedding, out of place: the kernels over rotary.cuh's rows (see there).
#include "rotary.cuh"

// Two kernels, half tables and full ones: one kernel with both paths took the full path's
// registers for both (bf16: 58 against 48, fp32: 48 against 40; ptxas -v), one block fewer an SM,
// and ran about 5 % slower on half tables (H200, bench/bench_ops_peers.py --ops rotary). Written
// out, not made by a macro: opsmith's launcher reads kernel signatures from the source.
template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary(const T* __restrict__ x, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
       const long long* __restrict__ positions, T* __restrict__ y, long long rows, int d, int half, int interleaved,
       int sign, int has_pos, int s0, int s1, int s2, int s3, long long c0, long long c1, long long c2, long long c3,
       long long p0, long long p1, long long p2, long long p3) {
    (void)s0;  // the outermost size bounds nothing: rows does
    rotary_any<false, false>(x, cos_t, sin_t, positions, y, rows, d, half, interleaved, sign, has_pos, s1, s2, s3, c0, c1,
                      c2, c3, p0, p1, p2, p3, blockIdx.x, gridDim.x);
}

template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary_full(const T* __restrict__ x, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
            const long long* __restrict__ positions, T* __restrict__ y, long long rows, int d, int half,
            int interleaved, int sign, int has_pos, int s0, int s1, int s2, int s3, long long c0, long long c1,
            long long c2, long long c3, long long p0, long long p1, long long p2, long long p3) {
    (void)s0;
    rotary_any<true, false>(x, cos_t, sin_t, positions, y, rows, d, half, interleaved, sign, has_pos, s1, s2, s3, c0, c1,
                     c2, c3, p0, p1, p2, p3, blockIdx.x, gridDim.x);
}

template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary_qk(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
          const long long* __restrict__ positions, T* __restrict__ y, T* __restrict__ y2, long long rows,
          long long rows2, int d, int half, int interleaved, int sign, int has_pos, int s0, int s1, int s2, int s3,
          long long c0, long long c1, long long c2, long long c3, long long p0, long long p1, long long p2,
          long long p3, int t0, int t1, int t2, int t3, long long e0, long long e1, long long e2, long long e3,
          long long f0, long long f1, long long f2, long long f3) {
    (void)s0, (void)t0;
    OPSMITH_ROTARY_QK_BODY(false, false, y, y2);
}

template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary_qk_full(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ cos_t,
               const T* __restrict__ sin_t, const long long* __restrict__ positions, T* __restrict__ y,
               T* __restrict__ y2, long long rows, long long rows2, int d, int half, int interleaved, int sign,
               int has_pos, int s0, int s1, int s2, int s3, long long c0, long long c1, long long c2, long long c3,
               long long p0, long long p1, long long p2, long long p3, int t0, int t1, int t2, int t3, long long e0,
               long long e1, long long e2, long long e3, long long f0, long long f1, long long f2, long long f3) {
    (void)s0, (void)t0;
    OPSMITH_ROTARY_QK_BODY(true, false, y, y2);
}

#ifndef OPSMITH_ROTARY_LEAN_HINT
// 1: rotary_lean<float> reads cos/sin under L2 evict_last (as torch.compile's kernel reads them), so that the streams
// of x and y do not evict the table rows the next heads read again (0: plain loads). H100, float32 forward + backward
// against compile(dynamic=False), one run each (docs/ops.md, "rotary's lean kernel"): the hint in rotary_qk (its
// OPSMITH_ROTARY_TABLE_HINT) 0.923-1.065x, bench/diag_rotary_lean.cu's kernel with it 1.009-1.104x
#define OPSMITH_ROTARY_LEAN_HINT 1
#endif

// 16 bytes of the table at p, under L2 evict_last where float's hint is on (sm_80 and later), else a plain load
template <class T>
__device__ __forceinline__ Pack<T, Vec<T>::N> ld_table(const T* __restrict__ p) {
#if OPSMITH_ROTARY_LEAN_HINT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (sizeof(T) == 4) {
        Pack<T, Vec<T>::N> r;
        unsigned* u = reinterpret_cast<unsigned*>(&r);
        asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
            : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p), "l"(l2_keep()));
        return r;
    }
#endif
    return ld<T, Vec<T>::N>(p);
}

// The common case alone, with the least work before the loads: neox pairs over rows of exactly 2 * half elements, x
// (and x2) contiguous rows, half tables [s3, half] whose row is the row's index modulo s3 (no positions, every other
// leading dim broadcast: [seq, half] beside [batch, heads, seq, 2 * half]), half a whole number of 16-byte vectors
// and at most blockDim.x of them, every pointer 16-byte aligned, rows below 2^31 (opsmith/ops/_rotary.py's lean()
// checks all of it). A thread rotates one vector of a row: no row loop, no layout or position arithmetic (30
// registers for float on sm_90 against rotary_qk's 40). Grid (blocks for the longer tensor, 1 or 2): x's blocks,
// then x2's. The arithmetic is store_unit's for half tables: the outputs are rotary_qk's. Launched only for the dtypes
// in _rotary.LEAN_DTYPES: float32 as shipped (docs/ops.md, "rotary's lean kernel").
template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
rotary_lean(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ cos_t,
            const T* __restrict__ sin_t, T* __restrict__ y, T* __restrict__ y2, long long rows, long long rows2,
            int half, int s3, int sign) {
    constexpr int N = Vec<T>::N;
    const bool second = blockIdx.y;
    const unsigned r = blockIdx.x * blockDim.y + threadIdx.y;
    const int j = threadIdx.x * N;
    if (r >= (second ? rows2 : rows) || j >= half) return;
    const long long row = (long long)r * (2 * half), t = (long long)(r % (unsigned)s3) * half + j;
    const T* xr = (second ? x2 : x) + row;
    Unit<T, N> u;
    u.a = ld<T, N>(xr + j);
    u.b = ld<T, N>(xr + half + j);
    u.c = ld_table(cos_t + t);
    u.s = ld_table(sin_t + t);
    store_unit<T, N, false>((second ? y2 : y) + row, u, j, half, 0, sign);  // at the row's j and half + j
}
