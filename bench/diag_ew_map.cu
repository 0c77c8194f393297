// bench/diag_ew_map.py's elementwise kernels: the shipped loop of elementwise.cu (MAP 0: a thread's
// U vectors a grid apart) beside a block-contiguous map (MAP 1: a block's U * blockDim vectors are one
// span, a thread's vectors blockDim apart, as torch's vectorised kernel), U vectors in flight a thread.
#include "common.cuh"
#include "activations.cuh"

namespace opsmith {
template <class Op, bool G, class T, int U, int MAP>
__device__ __forceinline__ void map_v(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y,
                                      long long n) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const long long nvec = n / N;
    const Vec<T>* xv = reinterpret_cast<const Vec<T>*>(x);
    const Vec<T>* gv = reinterpret_cast<const Vec<T>*>(g);
    Raw* yr = reinterpret_cast<Raw*>(y);
    const long long step = MAP == 0 ? (long long)gridDim.x * blockDim.x : blockDim.x;  // between a thread's U
    const long long trip = (long long)gridDim.x * blockDim.x * U;
    long long i = MAP == 0 ? blockIdx.x * (long long)blockDim.x + threadIdx.x
                           : blockIdx.x * (long long)blockDim.x * U + threadIdx.x;
    for (; i + (U - 1) * step < nvec; i += trip) {
        Vec<T> a[U], b[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            a[u] = xv[i + u * step];
            if (G) b[u] = gv[i + u * step];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A xa = Elem<T>::load(a[u].v[k]);
                o[k] = G ? act_bwd<Op, T>(Elem<T>::load(b[u].v[k]), xa) : act_fwd<Op, T>(xa);
            }
            yr[i + u * step] = raw_pack<T>(o);
        }
    }
    for (int u = 0; u < U; ++u, i += step) {  // a partial trip: each vector on its own
        if (i >= nvec) break;
        const Vec<T> a = xv[i];
        Vec<T> b;
        if (G) b = gv[i];
        A o[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const A xa = Elem<T>::load(a.v[k]);
            o[k] = G ? act_bwd<Op, T>(Elem<T>::load(b.v[k]), xa) : act_fwd<Op, T>(xa);
        }
        yr[i] = raw_pack<T>(o);
    }
}
// MAP 2: no loop. Each thread's U vectors at base + u * blockDim (a block's U * blockDim one span), checked
// only in the last block; the n % N tail elements by block 0's first threads. The grid covers nvec once.
template <class Op, bool G, class T, int U>
__device__ __forceinline__ void one_v(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y,
                                      long long n) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const long long nvec = n / N;
    const Vec<T>* xv = reinterpret_cast<const Vec<T>*>(x);
    const Vec<T>* gv = reinterpret_cast<const Vec<T>*>(g);
    Raw* yr = reinterpret_cast<Raw*>(y);
    const long long base = (long long)blockIdx.x * (blockDim.x * U) + threadIdx.x;
    const bool whole = (long long)(blockIdx.x + 1) * (blockDim.x * U) <= nvec;
    Vec<T> a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (whole || base + u * blockDim.x < nvec) {
            a[u] = xv[base + u * blockDim.x];
            if (G) b[u] = gv[base + u * blockDim.x];
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (whole || base + u * blockDim.x < nvec) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const A xa = Elem<T>::load(a[u].v[k]);
                o[k] = G ? act_bwd<Op, T>(Elem<T>::load(b[u].v[k]), xa) : act_fwd<Op, T>(xa);
            }
            yr[base + u * blockDim.x] = raw_pack<T>(o);
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < n - nvec * N) {
        const long long i = nvec * N + threadIdx.x;
        const A xa = Elem<T>::load(x[i]);
        y[i] = Elem<T>::store(G ? act_bwd<Op, T>(Elem<T>::load(g[i]), xa) : act_fwd<Op, T>(xa));
    }
}

// the erf GELU's backward with exp from ex2.approx for the 16-bit types (erf as before)
struct GeluErfX : GeluErf {
    static __device__ __forceinline__ float bwd_fast(float g, float x) {
        const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
        float e;
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * x * (-0.5f * 1.4426950408889634f)));
        return g * fmaf(x, e * 0.39894228040143267794f, cdf);
    }
};

template <class Op, bool G, class T, int U, int MAP>
__device__ __forceinline__ void run(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y, long long n) {
    if constexpr (MAP == 2) one_v<Op, G, T, U>(g, x, y, n);
    else map_v<Op, G, T, U, MAP>(g, x, y, n);
}
}  // namespace opsmith

template <class T, int U, int MAP> __global__ void relu_fwd_map(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::Relu, false, T, U, MAP>(nullptr, x, y, n);
}
template <class T, int U, int MAP>
__global__ void relu_bwd_map(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::Relu, true, T, U, MAP>(g, x, y, n);
}
template <class T, int U, int MAP> __global__ void gelu_erf_fwd_map(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::GeluErf, false, T, U, MAP>(nullptr, x, y, n);
}
template <class T, int U, int MAP>
__global__ void gelu_erf_bwd_map(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::GeluErf, true, T, U, MAP>(g, x, y, n);
}
template <class T, int U, int MAP> __global__ void silu_fwd_map(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::Silu, false, T, U, MAP>(nullptr, x, y, n);
}
template <class T, int U, int MAP>
__global__ void silu_bwd_map(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::Silu, true, T, U, MAP>(g, x, y, n);
}
template <class T, int U, int MAP> __global__ void gelu_erfx_fwd_map(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::GeluErfX, false, T, U, MAP>(nullptr, x, y, n);
}
template <class T, int U, int MAP>
__global__ void gelu_erfx_bwd_map(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::GeluErfX, true, T, U, MAP>(g, x, y, n);
}
template <class T, int U, int MAP> __global__ void gelu_tanh_fwd_map(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::GeluTanh, false, T, U, MAP>(nullptr, x, y, n);
}
template <class T, int U, int MAP>
__global__ void gelu_tanh_bwd_map(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::run<opsmith::GeluTanh, true, T, U, MAP>(g, x, y, n);
}
