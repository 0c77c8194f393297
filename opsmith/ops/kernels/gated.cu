// opsmith.ops gated activations (the SwiGLU / GeGLU MLP's middle): y = act(gate) * up.
//
// gate and up are [rows, d] arrays, each with its own row stride (in elements; columns are
// contiguous): the two halves of a packed [gate | up] row (vLLM's and FlashInfer's layout, the
// silu_and_mul op: up = gate + d, both strides 2*d), or two tensors such as the outputs of a
// gate and an up projection (the silu_mul op: strides d, or a view's own). y is [rows, d],
// contiguous. The backward takes grad_y (contiguous) and writes d_gate = grad_y * up *
// act'(gate) and d_up = grad_y * act(gate), two arrays of one row stride (2*d: the halves of
// a packed gradient; d: two tensors). Math in float (double for double).
//
// Launch (opsmith/ops/_launch.py, gated_plan): a 2-D grid. threadIdx.x / blockIdx.x walk a
// row's columns, threadIdx.y / blockIdx.y its rows; both loops stride by the whole grid, so
// any grid is correct and no element index is divided. Each trip loads OPSMITH_GATED_ROWS rows
// (rstep apart) before it computes, so that many loads are in flight. 16-byte vectors (8
// halves, 4 floats, 2 doubles) when d and every row stride are multiples of the vector width
// and every pointer is 16-byte aligned; else the same loops one element at a time.
//
// Kernels: <op>_fwd<T>(gate, up, y, rows, d, gate_stride, up_stride) and
// <op>_bwd<T>(grad_y, gate, up, d_gate, d_up, rows, d, gate_stride, up_stride, grad_stride),
// op in silu_and_mul, gelu_and_mul (erf), gelu_tanh_and_mul; T in {float, double, __half,
// __nv_bfloat16}.
#include "common.cuh"
#include "activations.cuh"

#ifndef OPSMITH_EW_THREADS
#define OPSMITH_EW_THREADS 256
#endif
// Measured on an H200 with bench/diag_gated.py (bench/results/ops-bwd-h200-2026-11-26/gated.json):
// 2 rows a trip made the backward 17-24 % faster than 4 (its 91 registers a thread let 512 threads
// an SM run; at 2 rows more run), the forward the same; the minimum blocks (1-4) changed nothing
// once the rows were 2.
#ifndef OPSMITH_GATED_FWD_BLOCKS
#define OPSMITH_GATED_FWD_BLOCKS 2  // minimum blocks of OPSMITH_EW_THREADS an SM holds (registers a thread)
#endif
#ifndef OPSMITH_GATED_BWD_BLOCKS
#define OPSMITH_GATED_BWD_BLOCKS 2
#endif
#ifndef OPSMITH_GATED_ROWS
#define OPSMITH_GATED_ROWS 2  // rows a thread loads per trip (opsmith/ops/_launch.py reads it too)
#endif

namespace opsmith {

// one element: y = act(gate) * up; or, when G, the two input gradients (T: the element type, whose
// width picks the activation's form: activations.cuh's act_fwd)
template <class Op, class T, class A>
__device__ __forceinline__ A gated_fwd1(A gate, A up) { return act_fwd<Op, T>(gate) * up; }

template <class Op, class T, class A>
__device__ __forceinline__ void gated_bwd1(A g, A gate, A up, A& d_gate, A& d_up) {
    d_gate = act_bwd<Op, T>(g * up, gate);  // (g * up) * act'(gate)
    d_up = g * act_fwd<Op, T>(gate);
}

// N elements (one 16-byte vector) of one row: y, or (G) d_gate and d_up, packed into 16 bytes of T
// (raw_pack: two 16-bit elements an instruction)
template <class Op, bool G, class T>
__device__ __forceinline__ void gated_vec(const Vec<T>& gv, const Vec<T>& a, const Vec<T>& b, Raw& o0, Raw& o1) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N;
    A r0[N], r1[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
        if (G) {
            gated_bwd1<Op, T>(Elem<T>::load(gv.v[k]), Elem<T>::load(a.v[k]), Elem<T>::load(b.v[k]), r0[k], r1[k]);
        } else {
            r0[k] = gated_fwd1<Op, T>(Elem<T>::load(a.v[k]), Elem<T>::load(b.v[k]));
        }
    }
    o0 = raw_pack<T>(r0);
    if (G) o1 = raw_pack<T>(r1);
}

// g: grad_y (G) or unused; out: y (!G, row stride d) or d_gate (G, row stride os); out1: d_up (G).
template <class Op, bool G, class T>
__device__ __forceinline__ void gated(const T* __restrict__ g, const T* __restrict__ gate, const T* __restrict__ up,
                                      T* __restrict__ out, T* __restrict__ out1, long long rows, long long d,
                                      long long gs, long long us, long long os) {
    typedef typename Elem<T>::acc A;
    constexpr int N = Vec<T>::N, R = OPSMITH_GATED_ROWS;
    const long long r0 = blockIdx.y * (long long)blockDim.y + threadIdx.y;
    const long long rstep = (long long)gridDim.y * blockDim.y;
    const long long c0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long cstep = (long long)gridDim.x * blockDim.x;
    if (!G) os = d;
    const bool vec = d % N == 0 && gs % N == 0 && us % N == 0 && os % N == 0 && aligned16(gate) &&
                     aligned16(up) && aligned16(out) && (!G || (aligned16(g) && aligned16(out1)));
    if (vec) {
        const long long cols = d / N;  // N is a power of two: a shift, once
        for (long long r = r0; r < rows; r += R * rstep) {
            for (long long c = c0; c < cols; c += cstep) {
                Vec<T> a[R], b[R], gv[R];
#pragma unroll
                for (int k = 0; k < R; ++k) {  // every load of the trip first
                    const long long rk = r + k * rstep;
                    if (rk < rows) {
                        a[k] = reinterpret_cast<const Vec<T>*>(gate + rk * gs)[c];
                        b[k] = reinterpret_cast<const Vec<T>*>(up + rk * us)[c];
                        if (G) gv[k] = reinterpret_cast<const Vec<T>*>(g + rk * d)[c];
                    }
                }
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    const long long rk = r + k * rstep;
                    if (rk < rows) {
                        Raw o0, o1;
                        gated_vec<Op, G, T>(gv[k], a[k], b[k], o0, o1);
                        reinterpret_cast<Raw*>(out + rk * os)[c] = o0;
                        if (G) reinterpret_cast<Raw*>(out1 + rk * os)[c] = o1;
                    }
                }
            }
        }
        return;
    }
    for (long long r = r0; r < rows; r += rstep) {  // unaligned, or d or a stride not a multiple of N
        for (long long j = c0; j < d; j += cstep) {
            const A a = Elem<T>::load(gate[r * gs + j]), b = Elem<T>::load(up[r * us + j]);
            if (G) {
                A da, db;
                gated_bwd1<Op, T>(Elem<T>::load(g[r * d + j]), a, b, da, db);
                out[r * os + j] = Elem<T>::store(da);
                out1[r * os + j] = Elem<T>::store(db);
            } else {
                out[r * d + j] = Elem<T>::store(gated_fwd1<Op, T>(a, b));
            }
        }
    }
}

}  // namespace opsmith

// The kernels, written out so that their signatures can be read from the source.

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_FWD_BLOCKS)
silu_and_mul_fwd(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, long long rows,
                 long long d, long long gate_stride, long long up_stride) {
    opsmith::gated<opsmith::Silu, false, T>(nullptr, gate, up, y, nullptr, rows, d, gate_stride, up_stride, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_BWD_BLOCKS)
silu_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                 T* __restrict__ d_gate, T* __restrict__ d_up, long long rows, long long d, long long gate_stride,
                 long long up_stride, long long grad_stride) {
    opsmith::gated<opsmith::Silu, true, T>(grad_y, gate, up, d_gate, d_up, rows, d, gate_stride, up_stride,
                                           grad_stride);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_FWD_BLOCKS)
gelu_and_mul_fwd(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, long long rows,
                 long long d, long long gate_stride, long long up_stride) {
    opsmith::gated<opsmith::GeluErf, false, T>(nullptr, gate, up, y, nullptr, rows, d, gate_stride, up_stride, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_BWD_BLOCKS)
gelu_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                 T* __restrict__ d_gate, T* __restrict__ d_up, long long rows, long long d, long long gate_stride,
                 long long up_stride, long long grad_stride) {
    opsmith::gated<opsmith::GeluErf, true, T>(grad_y, gate, up, d_gate, d_up, rows, d, gate_stride, up_stride,
                                              grad_stride);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_FWD_BLOCKS)
gelu_tanh_and_mul_fwd(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, long long rows,
                      long long d, long long gate_stride, long long up_stride) {
    opsmith::gated<opsmith::GeluTanh, false, T>(nullptr, gate, up, y, nullptr, rows, d, gate_stride, up_stride, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_BWD_BLOCKS)
gelu_tanh_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                      T* __restrict__ d_gate, T* __restrict__ d_up, long long rows, long long d,
                      long long gate_stride, long long up_stride, long long grad_stride) {
    opsmith::gated<opsmith::GeluTanh, true, T>(grad_y, gate, up, d_gate, d_up, rows, d, gate_stride, up_stride,
                                               grad_stride);
}
