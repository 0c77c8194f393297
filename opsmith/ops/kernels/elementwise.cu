// opsmith.ops elementwise kernels: ReLU, GELU (erf and tanh forms), SiLU; forward and backward.
//
// One pattern for all: a grid-stride loop over 16-byte vectors (8 halves, 4 floats, 2 doubles), then
// a scalar tail. The launch (opsmith/ops/_launch.py's elementwise_plan) gives each thread one vector:
// on the H200 that was the fastest map for every op but one, from 2 to 512 MiB (bench/diag_ew_map.py).
// The one, the erf GELU's forward, runs UNROLL vectors in flight a thread, one trip a thread from half
// a wave of blocks: there the erf's many instructions amortise a trip's index math. The
// other kernels keep one vector a trip: compiled with the unrolled loop, their registers rose
// (silu<float> to 60) and cut the one-vector launch's occupancy, 10 % slower.
// Pointers that are not 16-byte aligned (a view at an odd offset) take the scalar loop for everything.
//
// Kernels: <op>_fwd<T>(x, y, n) and <op>_bwd<T>(grad_y, x, grad_x, n), T in
// {float, double, __half, __nv_bfloat16}; math in float (double for double; the 16-bit types take
// the activations' fast forms, activations.cuh).
#include "common.cuh"
#include "activations.cuh"

#ifndef OPSMITH_EW_THREADS
#define OPSMITH_EW_THREADS 256
#endif
#define OPSMITH_EW_UNROLL 4

namespace opsmith {

// -- the loops -----------------------------------------------------------------------------------
// Op::fwd over a loaded vector a, or (when G) Op::bwd(b, a), packed for one 16-byte store
template <class Op, bool G, class T>
__device__ __forceinline__ Raw apply_vec(const Vec<T>& a, const Vec<T>& b) {
    typedef typename Elem<T>::acc A;
    A o[Vec<T>::N];
#pragma unroll
    for (int k = 0; k < Vec<T>::N; ++k) {
        const A xa = Elem<T>::load(a.v[k]);
        o[k] = G ? act_bwd<Op, T>(Elem<T>::load(b.v[k]), xa) : act_fwd<Op, T>(xa);
    }
    return raw_pack<T>(o);  // two 16-bit elements an instruction
}

// y[i] = Op::fwd(x[i]), or (when G) Op::bwd(g[i], x[i]), for the i-th 16-byte vector
template <class Op, bool G, class T>
__device__ __forceinline__ void one_vec(const Vec<T>* __restrict__ gv, const Vec<T>* __restrict__ xv,
                                        Raw* __restrict__ yr, long long i) {
    const Vec<T> a = xv[i];
    Vec<T> b;
    if (G) b = gv[i];
    yr[i] = apply_vec<Op, G, T>(a, b);
}

// y = Op::fwd(x), or (when G) y = Op::bwd(g, x): a loop of U vectors a trip, then one vector a trip.
// float and double at U = 1: no loop where the grid covers every vector (the plan's launch). The forms
// are what measured fastest per type (bench/diag_ew_map.py, H200, 32-512 MiB): no loop ran the float
// GELUs 1-5 % faster ("m2u1"); the 16-bit backward of the erf GELU ran 1.04-1.06x faster with the loop
// pair at U = 1, where the second loop never runs ("m1u1"), the others within 1 %.
template <class Op, bool G, class T, int U = 1>
__device__ __forceinline__ void map(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ y,
                                    long long n) {
    typedef typename Elem<T>::acc A;
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;  // elements handled by the vector loops
    if (aligned16(x) && aligned16(y) && (!G || aligned16(g))) {
        constexpr int N = Vec<T>::N;
        const long long nvec = n / N;
        const Vec<T>* xv = reinterpret_cast<const Vec<T>*>(x);
        const Vec<T>* gv = reinterpret_cast<const Vec<T>*>(g);
        Raw* yr = reinterpret_cast<Raw*>(y);
        if (U == 1 && sizeof(T) >= 4 && stride >= nvec) {
            if (tid < nvec) one_vec<Op, G, T>(gv, xv, yr, tid);
        } else {
            long long i = tid;
            // U independent vectors per trip: their loads are all in flight before any math
            for (; i + (U - 1) * stride < nvec; i += U * stride) {
                Vec<T> a[U], b[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    a[u] = xv[i + u * stride];
                    if (G) b[u] = gv[i + u * stride];
                }
#pragma unroll
                for (int u = 0; u < U; ++u) yr[i + u * stride] = apply_vec<Op, G, T>(a[u], b[u]);
            }
            for (; i < nvec; i += stride) one_vec<Op, G, T>(gv, xv, yr, i);
        }
        done = nvec * N;
    }
    for (long long i = done + tid; i < n; i += stride) {  // the tail, or everything when unaligned
        const A xa = Elem<T>::load(x[i]);
        y[i] = Elem<T>::store(G ? act_bwd<Op, T>(Elem<T>::load(g[i]), xa) : act_fwd<Op, T>(xa));
    }
}

}  // namespace opsmith

// The kernels, written out so that their signatures can be read from the source.

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
relu_fwd(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::map<opsmith::Relu, false, T>(nullptr, x, y, n);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
relu_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x, long long n) {
    opsmith::map<opsmith::Relu, true, T>(grad_y, x, grad_x, n);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_erf_fwd(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::map<opsmith::GeluErf, false, T, OPSMITH_EW_UNROLL>(nullptr, x, y, n);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_erf_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x, long long n) {
    opsmith::map<opsmith::GeluErf, true, T>(grad_y, x, grad_x, n);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_tanh_fwd(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::map<opsmith::GeluTanh, false, T>(nullptr, x, y, n);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_tanh_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x, long long n) {
    opsmith::map<opsmith::GeluTanh, true, T>(grad_y, x, grad_x, n);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
silu_fwd(const T* __restrict__ x, T* __restrict__ y, long long n) {
    opsmith::map<opsmith::Silu, false, T>(nullptr, x, y, n);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
silu_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x, long long n) {
    opsmith::map<opsmith::Silu, true, T>(grad_y, x, grad_x, n);
}
