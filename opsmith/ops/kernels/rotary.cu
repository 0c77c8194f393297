// opsmith.ops rotary position embedding: each pair (a, b) of a row's first 2*half elements is
// rotated by the angle of its row's position and its pair index j:
//   a' = a cos - b sin,  b' = b cos + a sin   (sign = -1: the inverse rotation, the backward)
// neox layout: pairs (j, j + half); gptj (interleaved): pairs (2j, 2j + 1). Elements from
// 2*half to d are copied.
//
// x is rows x d (rows: the leading dims, at most 4, sizes in meta[0..3] right-aligned and
// padded with 1). cos/sin hold `half` values per row of their own: without positions their
// row of x's row (i0..i3) starts at sum(i_k * meta[4 + k]) (0 strides broadcast); with
// positions, at positions[sum(i_k * meta[8 + k])] * half of a [max_position, half] table.
//
// Kernel: rotary<T>(x, cos, sin, positions, y, meta, rows, d, half, interleaved, sign, has_pos),
// T in {float, double, __half, __nv_bfloat16}; math in float (double for double).
#include "common.cuh"

#ifndef OPSMITH_EW_THREADS
#define OPSMITH_EW_THREADS 256
#endif

using namespace opsmith;

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
rotary(const T* __restrict__ x, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
       const long long* __restrict__ positions, T* __restrict__ y, const long long* __restrict__ meta,
       long long rows, int d, int half, int interleaved, int sign, int has_pos) {
    typedef typename Elem<T>::acc A;
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = tid; i < rows * half; i += stride) {
        const long long r = i / half;
        const int j = (int)(i - r * half);
        long long rest = r, coff = 0, poff = 0;
#pragma unroll
        for (int k = 3; k >= 0; --k) {  // r's index along each leading dim, innermost last
            const long long idx = rest % meta[k];
            rest /= meta[k];
            coff += idx * meta[4 + k];
            poff += idx * meta[8 + k];
        }
        if (has_pos) coff = positions[poff] * half;
        const A c = Elem<T>::load(cos_t[coff + j]);
        const A s = A(sign) * Elem<T>::load(sin_t[coff + j]);
        const long long ia = r * d + (interleaved ? 2 * j : j), ib = ia + (interleaved ? 1 : half);
        const A a = Elem<T>::load(x[ia]), b = Elem<T>::load(x[ib]);
        y[ia] = Elem<T>::store(a * c - b * s);
        y[ib] = Elem<T>::store(b * c + a * s);
    }
    const int tail = d - 2 * half;  // the dims beyond the rotary ones: copied
    for (long long i = tid; tail > 0 && i < rows * tail; i += stride) {
        const long long r = i / tail, k = 2 * half + (i - r * tail);
        y[r * d + k] = x[r * d + k];
    }
}
