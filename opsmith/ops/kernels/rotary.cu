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
