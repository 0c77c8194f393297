// PROTOTYPE: one 16-byte vector of one row a thread, 32-bit indices, no alignment test (the caller's).
#include "gated.cu"
template <class Op, bool G, class T>
__device__ __forceinline__ void lean(const T* __restrict__ g, const T* __restrict__ gate, const T* __restrict__ up,
                                     T* __restrict__ out, T* __restrict__ out1, int rows, int cols, int gs, int us, int os) {
    const int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows || c >= cols) return;
    opsmith::Vec<T> a = reinterpret_cast<const opsmith::Vec<T>*>(gate + (long long)r * gs)[c];
    opsmith::Vec<T> b = reinterpret_cast<const opsmith::Vec<T>*>(up + (long long)r * us)[c];
    opsmith::Vec<T> gv;
    if (G) gv = reinterpret_cast<const opsmith::Vec<T>*>(g + (long long)r * cols * opsmith::Vec<T>::N)[c];
    opsmith::Raw o0, o1;
    opsmith::gated_vec<Op, G, T>(gv, a, b, o0, o1);
    reinterpret_cast<opsmith::Raw*>(out + (long long)r * os)[c] = o0;
    if (G) reinterpret_cast<opsmith::Raw*>(out1 + (long long)r * os)[c] = o1;
}
template <class T> __global__ void __launch_bounds__(256, 8)
lean_silu_fwd(const T* gate, const T* up, T* y, int rows, int cols, int gs, int us) {
    lean<opsmith::Silu, false, T>(nullptr, gate, up, y, nullptr, rows, cols, gs, us, cols * opsmith::Vec<T>::N);
}
template <class T> __global__ void __launch_bounds__(256, 6)
lean_silu_bwd(const T* g, const T* gate, const T* up, T* dg, T* du, int rows, int cols, int gs, int us, int os) {
    lean<opsmith::Silu, true, T>(g, gate, up, dg, du, rows, cols, gs, us, os);
}
