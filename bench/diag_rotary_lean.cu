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

template <class T>
__global__ void __launch_bounds__(256)
rotary_lean(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ cos_t,
            const T* __restrict__ sin_t, T* __restrict__ y, T* __restrict__ y2, long long rows, long long rows2,
            int half, int s3, int sign) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const bool second = blockIdx.y;
    const unsigned r = blockIdx.x * blockDim.y + threadIdx.y;
    const int j = threadIdx.x * N;
    if (r >= (second ? rows2 : rows) || j >= half) return;  // the plan's threads a row: a power of two
    const T* xr = (second ? x2 : x) + (long long)r * (2 * half) + j;
    T* yr = (second ? y2 : y) + (long long)r * (2 * half) + j;
    const long long t = (long long)(r % (unsigned)s3) * half + j;
    const Vec<T> a = *reinterpret_cast<const Vec<T>*>(xr), b = *reinterpret_cast<const Vec<T>*>(xr + half);
    const Vec<T> c = *reinterpret_cast<const Vec<T>*>(cos_t + t), s = *reinterpret_cast<const Vec<T>*>(sin_t + t);
    A ra[N], rb[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const A c1 = Elem<T>::load(c.v[k]), sa = A(sign) * Elem<T>::load(s.v[k]);
        const A av = Elem<T>::load(a.v[k]), bv = Elem<T>::load(b.v[k]);
        ra[k] = av * c1 - bv * sa;
        rb[k] = bv * c1 + av * sa;
    }
    *reinterpret_cast<Raw*>(yr) = raw_pack<T>(ra);
    *reinterpret_cast<Raw*>(yr + half) = raw_pack<T>(rb);
}
