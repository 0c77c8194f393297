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
// Launch (opsmith/ops/_launch_gated.py, gated_plan): a 2-D grid. threadIdx.x / blockIdx.x walk a
// row's columns, threadIdx.y / blockIdx.y its rows; both loops stride by the whole grid, so
// any grid is correct and no element index is divided. Each trip loads R rows (rstep apart;
// GatedShape below) before it computes, so that many loads are in flight. 16-byte vectors (8
// halves, 4 floats, 2 doubles) when d and every row stride are multiples of the vector width
// and every pointer is 16-byte aligned; else the same loops one element at a time.
//
// Kernels: <op>_fwd<T>(gate, up, y, rows, d, gate_stride, up_stride) and
// <op>_bwd<T>(grad_y, gate, up, d_gate, d_up, rows, d, gate_stride, up_stride, grad_stride),
// op in silu_and_mul, gelu_and_mul (erf), gelu_tanh_and_mul; T in {float, double, __half,
// __nv_bfloat16}. And, for silu and the tanh GELU, <op>_fwd_one / <op>_bwd_one: the same on a
// grid of one 16-byte vector of one row a thread (no loops), int rows, vectors a row and strides,
// for a caller that has checked every address and stride whole vectors (opsmith/ops/_launch_gated.py,
// gated_one). Measured on an H200 (bench/results/ops-gated-h200-2026-11-26/), bf16 2048x2048 L2
// flushed: the forward 11.20 -> 10.75 us (Liger-Kernel's 10.74), the backward 15.44 -> 15.07.
#include "common.cuh"
#include "activations.cuh"

#ifndef OPSMITH_EW_THREADS
#define OPSMITH_EW_THREADS 256
#endif
// Rows a thread loads per trip (R) and the minimum blocks of OPSMITH_EW_THREADS an SM holds (the
// registers a thread may use), by activation and type (opsmith/ops/_launch_gated.py, gated_shape, mirrors
// them). Measured on an H200 (bench/results/ops-gated-h200-2026-11-26/, the kernels alone, L2
// flushed): bf16 silu and tanh GELU at one row a thread and 6 blocks an SM (40 registers) ran 1-6 %
// faster than at 2 rows and 2 blocks over 2048-65536 rows x 1024-4096. Their float and double
// forms (the exact math) spill at 40 registers and keep 2 rows, as does the erf GELU, whose 4 trips
// of 2 rows were measured in bench/results/ops-bwd-h200-2026-11-26/gated.json.
#ifndef OPSMITH_GATED_ROWS
#define OPSMITH_GATED_ROWS 2  // the erf GELU, and float and double
#endif
#ifndef OPSMITH_GATED_BLOCKS
#define OPSMITH_GATED_BLOCKS 2
#endif
#ifndef OPSMITH_GATED_ROWS16
#define OPSMITH_GATED_ROWS16 1  // silu and the tanh GELU on 16-bit types
#endif
#ifndef OPSMITH_GATED_BLOCKS16
#define OPSMITH_GATED_BLOCKS16 6
#endif
// 1: the backwards read grad_y evict-first (ld.global.cs: its last use), so that L2 gives up its lines before
// those of gate and up the backward has yet to read; 2: gate and up too; 0: plain loads. H100, forward + backward
// kernels after an L2 flush (bench/diag_bwd_hints.py, bf16 silu_and_mul, GB/s 0 / 1 / 2, Liger-Kernel's): 2048 x
// 2048 2,268 / 2,367 / 2,527 (2,307), 4096 x 4096 2,843 / 2,865 / 2,814, 8192 x 8192 2,995 / 3,001 / 2,981; the
// backward alone within 1 % at 1 and up to 1.7 % slower at 2, which stays a diagnostic.
#ifndef OPSMITH_BWD_LAST_USE
#define OPSMITH_BWD_LAST_USE 1
#endif

namespace opsmith {

// vector c of p, evict-first where `last` (the backward's last read of it: OPSMITH_BWD_LAST_USE)
template <class T> __device__ __forceinline__ Vec<T> ld_vec(const T* p, long long c, bool last) {
    const Vec<T>* q = reinterpret_cast<const Vec<T>*>(p) + c;
    if (!last) return *q;
    Raw r;
    asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(q));
    return *reinterpret_cast<const Vec<T>*>(&r);
}

template <class Op, class T> struct GatedShape {
    static constexpr bool fast = sizeof(T) == 2 && Op::cheap;  // the 16-bit forms of activations.cuh
    static constexpr int rows = fast ? OPSMITH_GATED_ROWS16 : OPSMITH_GATED_ROWS;
    static constexpr int blocks = fast ? OPSMITH_GATED_BLOCKS16 : OPSMITH_GATED_BLOCKS;
};

// one element: y = act(gate) * up; or, when G, the two input gradients (T: the element type, whose
// width picks the activation's form: activations.cuh's act_fwd)
template <class Op, class T, class A>
__device__ __forceinline__ A gated_fwd1(A gate, A up) { return act_fwd<Op, T>(gate) * up; }

// (the 16-bit types: act and act' from one sigmoid, Op::grad_fast; the backward of silu and the tanh
// GELU issued two ex2 + rcp pairs an element before, a third of its time at 2048 x 2048 on an H200)
template <class Op, class T, class A>
__device__ __forceinline__ void gated_bwd1(A g, A gate, A up, A& d_gate, A& d_up) {
    if constexpr (sizeof(T) == 2) {
        A y;
        const A d = Op::grad_fast(gate, y);
        d_gate = (g * up) * d;
        d_up = g * y;
    } else {
        d_gate = act_bwd<Op, T>(g * up, gate);  // (g * up) * act'(gate)
        d_up = g * act_fwd<Op, T>(gate);
    }
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
    constexpr int N = Vec<T>::N, R = GatedShape<Op, T>::rows;
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
                    const long long rk = r + k * rstep, q = G ? bwd_row(rk, rows) : rk;
                    if (rk < rows) {
                        a[k] = ld_vec(gate + q * gs, c, G && OPSMITH_BWD_LAST_USE > 1);
                        b[k] = ld_vec(up + q * us, c, G && OPSMITH_BWD_LAST_USE > 1);
                        if (G) gv[k] = ld_vec(g + q * d, c, OPSMITH_BWD_LAST_USE > 0);
                    }
                }
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    const long long rk = r + k * rstep, q = G ? bwd_row(rk, rows) : rk;
                    if (rk < rows) {
                        Raw o0, o1;
                        gated_vec<Op, G, T>(gv[k], a[k], b[k], o0, o1);
                        reinterpret_cast<Raw*>(out + q * os)[c] = o0;
                        if (G) reinterpret_cast<Raw*>(out1 + q * os)[c] = o1;
                    }
                }
            }
        }
        return;
    }
    for (long long r1 = r0; r1 < rows; r1 += rstep) {  // unaligned, or d or a stride not a multiple of N
        const long long r = G ? bwd_row(r1, rows) : r1;
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

// One 16-byte vector c of row r a thread (the grid covers the rows and their cols vectors once); every
// address and row stride (gs, us, os; grad_y's is cols * N) whole vectors.
template <class Op, bool G, class T>
__device__ __forceinline__ void gated_one(const T* __restrict__ g, const T* __restrict__ gate,
                                          const T* __restrict__ up, T* __restrict__ out, T* __restrict__ out1,
                                          int rows, int cols, int gs, int us, int os) {
    const int r1 = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r1 >= rows || c >= cols) return;
    const int r = G ? (int)bwd_row(r1, rows) : r1;
    const Vec<T> a = ld_vec(gate + (long long)r * gs, c, G && OPSMITH_BWD_LAST_USE > 1);
    const Vec<T> b = ld_vec(up + (long long)r * us, c, G && OPSMITH_BWD_LAST_USE > 1);
    Vec<T> gv;
    if (G) gv = ld_vec(g + (long long)r * cols * Vec<T>::N, c, OPSMITH_BWD_LAST_USE > 0);
    Raw o0, o1;
    gated_vec<Op, G, T>(gv, a, b, o0, o1);
    reinterpret_cast<Raw*>(out + (long long)r * os)[c] = o0;
    if (G) reinterpret_cast<Raw*>(out1 + (long long)r * os)[c] = o1;
}

}  // namespace opsmith

// The kernels, written out so that their signatures can be read from the source.

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, opsmith::GatedShape<opsmith::Silu, T>::blocks)
silu_and_mul_fwd(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, long long rows,
                 long long d, long long gate_stride, long long up_stride) {
    opsmith::gated<opsmith::Silu, false, T>(nullptr, gate, up, y, nullptr, rows, d,
                                                                gate_stride, up_stride, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, opsmith::GatedShape<opsmith::Silu, T>::blocks)
silu_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                 T* __restrict__ d_gate, T* __restrict__ d_up, long long rows, long long d, long long gate_stride,
                 long long up_stride, long long grad_stride) {
    opsmith::gated<opsmith::Silu, true, T>(grad_y, gate, up, d_gate, d_up, rows, d,
                                                               gate_stride, up_stride, grad_stride);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, opsmith::GatedShape<opsmith::GeluErf, T>::blocks)
gelu_and_mul_fwd(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, long long rows,
                 long long d, long long gate_stride, long long up_stride) {
    opsmith::gated<opsmith::GeluErf, false, T>(nullptr, gate, up, y, nullptr, rows, d,
                                                                       gate_stride, up_stride, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, opsmith::GatedShape<opsmith::GeluErf, T>::blocks)
gelu_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                 T* __restrict__ d_gate, T* __restrict__ d_up, long long rows, long long d, long long gate_stride,
                 long long up_stride, long long grad_stride) {
    opsmith::gated<opsmith::GeluErf, true, T>(grad_y, gate, up, d_gate, d_up, rows, d,
                                                                      gate_stride, up_stride, grad_stride);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, opsmith::GatedShape<opsmith::GeluTanh, T>::blocks)
gelu_tanh_and_mul_fwd(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, long long rows,
                      long long d, long long gate_stride, long long up_stride) {
    opsmith::gated<opsmith::GeluTanh, false, T>(nullptr, gate, up, y, nullptr, rows, d,
                                                                    gate_stride, up_stride, d);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, opsmith::GatedShape<opsmith::GeluTanh, T>::blocks)
gelu_tanh_and_mul_bwd(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                      T* __restrict__ d_gate, T* __restrict__ d_up, long long rows, long long d,
                      long long gate_stride, long long up_stride, long long grad_stride) {
    opsmith::gated<opsmith::GeluTanh, true, T>(grad_y, gate, up, d_gate, d_up, rows, d,
                                                                   gate_stride, up_stride, grad_stride);
}

// One vector of one row a thread (gated_one): silu and the tanh GELU.

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_BLOCKS16)
silu_and_mul_fwd_one(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, int rows,
                     int cols, int gate_stride, int up_stride) {
    opsmith::gated_one<opsmith::Silu, false, T>(nullptr, gate, up, y, nullptr, rows, cols, gate_stride,
                                                up_stride, cols * opsmith::Vec<T>::N);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_BLOCKS16)
silu_and_mul_bwd_one(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                     T* __restrict__ d_gate, T* __restrict__ d_up, int rows, int cols, int gate_stride,
                     int up_stride, int grad_stride) {
    opsmith::gated_one<opsmith::Silu, true, T>(grad_y, gate, up, d_gate, d_up, rows, cols, gate_stride,
                                               up_stride, grad_stride);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_BLOCKS16)
gelu_tanh_and_mul_fwd_one(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, int rows,
                          int cols, int gate_stride, int up_stride) {
    opsmith::gated_one<opsmith::GeluTanh, false, T>(nullptr, gate, up, y, nullptr, rows, cols, gate_stride,
                                                    up_stride, cols * opsmith::Vec<T>::N);
}

template <class T>
__global__ void __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_GATED_BLOCKS16)
gelu_tanh_and_mul_bwd_one(const T* __restrict__ grad_y, const T* __restrict__ gate, const T* __restrict__ up,
                          T* __restrict__ d_gate, T* __restrict__ d_up, int rows, int cols, int gate_stride,
                          int up_stride, int grad_stride) {
    opsmith::gated_one<opsmith::GeluTanh, true, T>(grad_y, gate, up, d_gate, d_up, rows, cols, gate_stride,
                                                   up_stride, grad_stride);
}
