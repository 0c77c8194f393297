// bench/diag_rotary.py's "lean" variant: rotary_qk's rotation for the common case alone, with the least work a thread
// does before its loads. It tests whether rotary_qk<T>'s general prologue (the q/k pick of 20 arguments, the
// layout and alignment checks, the row order, the table offset) costs float32's small shapes their gap to
// torch.compile: Nsight Compute (bench/results/ops-rotary-h100-2026-12-06-s5/) counts about 40 % more instructions
// an element for rotary_qk<float> than for compile's kernel, and 49 % against 82 % achieved occupancy.
//
// The case (the script checks it before it launches): neox pairs (j, j + half) over rows of exactly 2 * half
// elements, q and k contiguous, half tables [s3, half] read at row % s3 (no positions, every other leading dim
// broadcast, as bench_ops_peers' [1, heads, seq, 128] beside [seq, 64]), half a multiple of the 16-byte vector
// and at most blockDim.x vectors, every pointer 16-byte aligned, rows below 2^32.
// Launch: grid (blocks for the longer tensor, 2): q's blocks, then k's; block (half / N threads, rows a block).
// The arithmetic is rotary.cuh's store_unit for half tables, so the outputs match rotary_qk's.
#include "common.cuh"

using namespace opsmith;

// The L2 policies (common.cuh's l2_keep, l2_first): "lean1"/"pair1" (H 1) read the tables evict_last, as
// torch.compile's kernel does; "lean2"/"pair2" (H 2) also x evict_first
// 16 bytes at p, under L2 policy `pol` where `hint`
template <class T>
__device__ __forceinline__ Vec<T> ld_vec(const T* p, bool hint, unsigned long long pol) {
    if (!hint) return *reinterpret_cast<const Vec<T>*>(p);
    Raw r;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(pol));
    return *reinterpret_cast<const Vec<T>*>(&r);
}

// a and b (a pair's two halves, one vector each) rotated by c and sign * s, rounded to T and stored at y and y + half
template <class T>
__device__ __forceinline__ void rotate_store(const Vec<T>& a, const Vec<T>& b, const Vec<T>& c, const Vec<T>& s,
                                             int sign, T* y, int half) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    A ra[N], rb[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const A c1 = Elem<T>::load(c.v[k]), sa = A(sign) * Elem<T>::load(s.v[k]);
        const A av = Elem<T>::load(a.v[k]), bv = Elem<T>::load(b.v[k]);
        ra[k] = av * c1 - bv * sa;
        rb[k] = bv * c1 + av * sa;
    }
    *reinterpret_cast<Raw*>(y) = raw_pack<T>(ra);
    *reinterpret_cast<Raw*>(y + half) = raw_pack<T>(rb);
}

template <class T, int H>
__global__ void __launch_bounds__(256)
rotary_lean(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ cos_t,
            const T* __restrict__ sin_t, T* __restrict__ y, T* __restrict__ y2, long long rows, long long rows2,
            int half, int s3, int sign) {
    constexpr int N = Vec<T>::N;
    const bool second = blockIdx.y;
    const unsigned r = blockIdx.x * blockDim.y + threadIdx.y;
    const int j = threadIdx.x * N;
    if (r >= (second ? rows2 : rows) || j >= half) return;  // the plan's threads a row: a power of two
    const T* xr = (second ? x2 : x) + (long long)r * (2 * half) + j;
    T* yr = (second ? y2 : y) + (long long)r * (2 * half) + j;
    const long long t = (long long)(r % (unsigned)s3) * half + j;
    const unsigned long long keep = H ? l2_keep() : 0, first = H > 1 ? l2_first() : 0;
    const Vec<T> a = ld_vec(xr, H > 1, first), b = ld_vec(xr + half, H > 1, first);
    const Vec<T> c = ld_vec(cos_t + t, H > 0, keep), s = ld_vec(sin_t + t, H > 0, keep);
    rotate_store(a, b, c, s, sign, yr, half);
}

// bench/diag_rotary.py's "pair" variant: q and k of one shape rotated by the same thread, row r of each, the table's
// vectors loaded once for both (torch.compile's kernel for this case does the same: one program over q's elements,
// loading q, k, cos and sin at the same index; bench/results/ops-rotary-h100-2026-12-06-s6/). Launch: grid (blocks for
// the rows, 1), block as rotary_lean.
template <class T, int H>
__global__ void __launch_bounds__(256)
rotary_pair(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ cos_t,
            const T* __restrict__ sin_t, T* __restrict__ y, T* __restrict__ y2, long long rows, int half, int s3,
            int sign) {
    constexpr int N = Vec<T>::N;
    const unsigned r = blockIdx.x * blockDim.y + threadIdx.y;
    const int j = threadIdx.x * N;
    if (r >= rows || j >= half) return;
    const long long o = (long long)r * (2 * half) + j;
    const long long t = (long long)(r % (unsigned)s3) * half + j;
    const unsigned long long keep = H ? l2_keep() : 0, first = H > 1 ? l2_first() : 0;
    const Vec<T> a = ld_vec(x + o, H > 1, first), b = ld_vec(x + o + half, H > 1, first);
    const Vec<T> a2 = ld_vec(x2 + o, H > 1, first), b2 = ld_vec(x2 + o + half, H > 1, first);
    const Vec<T> c = ld_vec(cos_t + t, H > 0, keep), s = ld_vec(sin_t + t, H > 0, keep);
    rotate_store(a, b, c, s, sign, y + o, half);
    rotate_store(a2, b2, c, s, sign, y2 + o, half);
}
