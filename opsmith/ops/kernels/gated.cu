// opsmith.ops gated activations (the SwiGLU / GeGLU MLP's middle): silu_and_mul, gelu_and_mul.
//
// The input is packed: each row of x holds [gate | up], 2*d values; the output row holds d
// values, y = act(gate) * up (vLLM's and FlashInfer's layout). The backward takes grad_y (d a
// row) and x and writes grad_x (2*d a row): d_gate = grad_y * up * act'(gate), d_up =
// grad_y * act(gate). Math in float (double for double).
//
// One pattern: a grid-stride loop over 16-byte vectors of the output's columns (8 halves,
// 4 floats, 2 doubles), each vector reading the matching gate and up vectors of its row, when
// d is a multiple of the vector width and every pointer is 16-byte aligned; else one element
// at a time. The launch is the elementwise plan (opsmith/ops/_launch.py) over rows * d.
//
// Kernels: <op>_fwd<T>(x, y, rows, d) and <op>_bwd<T>(grad_y, x, grad_x, rows, d), op in
// silu_and_mul, gelu_and_mul (erf), gelu_tanh_and_mul; T in {float, double, __half, __nv_bfloat16}.
#include "common.cuh"
#include "activations.cuh"

#ifndef OPSMITH_EW_THREADS
#define OPSMITH_EW_THREADS 256
#endif

namespace opsmith {

// one output element: y = act(gate) * up; or, when G, the two input gradients
template <class Op, class A>
__device__ __forceinline__ A gated_fwd1(A gate, A up) { return Op::fwd(gate) * up; }

template <class Op, class A>
__device__ __forceinline__ void gated_bwd1(A g, A gate, A up, A& d_gate, A& d_up) {
    d_gate = Op::bwd(g * up, gate);  // (g * up) * act'(gate)
    d_up = g * Op::fwd(gate);
}

template <class Op, bool G, class T>
__device__ __forceinline__ void gated(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ out,
                                      long long rows, long long d) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long in_row = 2 * d;
    if (d % N == 0 && aligned16(x) && aligned16(out) && (!G || aligned16(g))) {
        const long long per_row = d / N, total = rows * per_row;
        for (long long v = tid; v < total; v += stride) {
            const long long r = v / per_row, c = v - r * per_row;
            const Vec<T> a = reinterpret_cast<const Vec<T>*>(x + r * in_row)[c];      // gate
            const Vec<T> b = reinterpret_cast<const Vec<T>*>(x + r * in_row + d)[c];  // up
            if (G) {
                const Vec<T> gv = reinterpret_cast<const Vec<T>*>(g + r * d)[c];
                Vec<T> dg, du;
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    A da, db;
                    gated_bwd1<Op>(Elem<T>::load(gv.v[k]), Elem<T>::load(a.v[k]), Elem<T>::load(b.v[k]), da, db);
                    dg.v[k] = Elem<T>::store(da);
                    du.v[k] = Elem<T>::store(db);
                }
                reinterpret_cast<Vec<T>*>(out + r * in_row)[c] = dg;
                reinterpret_cast<Vec<T>*>(out + r * in_row + d)[c] = du;
            } else {
                Vec<T> o;
#pragma unroll
                for (int k = 0; k < N; ++k)
                    o.v[k] = Elem<T>::store(gated_fwd1<Op>(Elem<T>::load(a.v[k]), Elem<T>::load(b.v[k])));
                reinterpret_cast<Vec<T>*>(out + r * d)[c] = o;
            }
        }
        return;
    }
    const long long total = rows * d;
    for (long long i = tid; i < total; i += stride) {  // unaligned, or d not a multiple of N
        const long long r = i / d, j = i - r * d;
        const A gate = Elem<T>::load(x[r * in_row + j]), up = Elem<T>::load(x[r * in_row + d + j]);
        if (G) {
            A da, db;
            gated_bwd1<Op>(Elem<T>::load(g[i]), gate, up, da, db);
            out[r * in_row + j] = Elem<T>::store(da);
            out[r * in_row + d + j] = Elem<T>::store(db);
        } else {
            out[i] = Elem<T>::store(gated_fwd1<Op>(gate, up));
        }
    }
}

}  // namespace opsmith

// The kernels, written out so that their signatures can be read from the source.

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
silu_and_mul_fwd(const T* __restrict__ x, T* __restrict__ y, long long rows, long long d) {
    opsmith::gated<opsmith::Silu, false, T>(nullptr, x, y, rows, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
silu_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x, long long rows,
                 long long d) {
    opsmith::gated<opsmith::Silu, true, T>(grad_y, x, grad_x, rows, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_and_mul_fwd(const T* __restrict__ x, T* __restrict__ y, long long rows, long long d) {
    opsmith::gated<opsmith::GeluErf, false, T>(nullptr, x, y, rows, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x, long long rows,
                 long long d) {
    opsmith::gated<opsmith::GeluErf, true, T>(grad_y, x, grad_x, rows, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_tanh_and_mul_fwd(const T* __restrict__ x, T* __restrict__ y, long long rows, long long d) {
    opsmith::gated<opsmith::GeluTanh, false, T>(nullptr, x, y, rows, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS)
gelu_tanh_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x,
                      long long rows, long long d) {
    opsmith::gated<opsmith::GeluTanh, true, T>(grad_y, x, grad_x, rows, d);
}
