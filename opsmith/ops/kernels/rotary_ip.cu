// opsmith.ops rotary position embedding in place: the kernels over rotary.cuh's rows (see there).
#include "rotary.cuh"

// In place: x is rotated where it lies (one pointer read and written, so not __restrict__, but read through
// ld.global.nc, rotary.cuh's ld_nc: a thread writes only the elements it has read, after reading them), the dims
// beyond the rotary ones untouched. rotary_ip<T>,
// rotary_ip_full<T>: (x, cos, sin, positions, rows, d, half, interleaved, sign, has_pos, s0..s3, c0..c3, p0..p3);
// rotary_qk_ip<T>, rotary_qk_ip_full<T>: (x, x2, cos, sin, positions, rows, rows2, d, half, interleaved, sign, has_pos,
// x's s, c, p, then x2's t, e, f), as rotary_qk.
template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary_ip(T* x, const T* __restrict__ cos_t, const T* __restrict__ sin_t, const long long* __restrict__ positions,
          long long rows, int d, int half, int interleaved, int sign, int has_pos, int s0, int s1, int s2, int s3,
          long long c0, long long c1, long long c2, long long c3, long long p0, long long p1, long long p2,
          long long p3) {
    (void)s0;
    rotary_any<false, true>(x, cos_t, sin_t, positions, x, rows, d, half, interleaved, sign, has_pos, s1, s2, s3, c0,
                            c1, c2, c3, p0, p1, p2, p3, blockIdx.x, gridDim.x);
}

template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary_ip_full(T* x, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
               const long long* __restrict__ positions, long long rows, int d, int half, int interleaved, int sign,
               int has_pos, int s0, int s1, int s2, int s3, long long c0, long long c1, long long c2, long long c3,
               long long p0, long long p1, long long p2, long long p3) {
    (void)s0;
    rotary_any<true, true>(x, cos_t, sin_t, positions, x, rows, d, half, interleaved, sign, has_pos, s1, s2, s3, c0,
                           c1, c2, c3, p0, p1, p2, p3, blockIdx.x, gridDim.x);
}

template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary_qk_ip(T* x, T* x2, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
             const long long* __restrict__ positions, long long rows, long long rows2, int d, int half,
             int interleaved, int sign, int has_pos, int s0, int s1, int s2, int s3, long long c0, long long c1,
             long long c2, long long c3, long long p0, long long p1, long long p2, long long p3, int t0, int t1,
             int t2, int t3, long long e0, long long e1, long long e2, long long e3, long long f0, long long f1,
             long long f2, long long f3) {
    (void)s0, (void)t0;
    OPSMITH_ROTARY_QK_BODY(false, true, x, x2);
}

template <class T>
__global__ void OPSMITH_ROTARY_BOUNDS
rotary_qk_ip_full(T* x, T* x2, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
                  const long long* __restrict__ positions, long long rows, long long rows2, int d, int half,
                  int interleaved, int sign, int has_pos, int s0, int s1, int s2, int s3, long long c0, long long c1,
                  long long c2, long long c3, long long p0, long long p1, long long p2, long long p3, int t0, int t1,
                  int t2, int t3, long long e0, long long e1, long long e2, long long e3, long long f0, long long f1,
                  long long f2, long long f3) {
    (void)s0, (void)t0;
    OPSMITH_ROTARY_QK_BODY(true, true, x, x2);
}
