// The activations of opsmith.ops: forward f(x) and backward g * f'(x), in the accumulation type
// A (float, or double for double). Shared by elementwise.cu (relu, gelu, silu) and gated.cu
// (silu_and_mul, gelu_and_mul).
//
// For the 16-bit types (act_fwd / act_bwd below) SiLU and the tanh GELU take their sigmoid from
// the approximate ex2 and rcp instructions (a relative error of a few 1e-7, against the 2^-9 and
// 2^-12 of a bf16 or half result): the exact expf and the IEEE division were most of the gated
// kernels' instructions, which left their bf16 forwards at 86-93 % of copy bandwidth. float and
// double keep the exact forms.
#pragma once
#include "common.cuh"

namespace opsmith {

// sigmoid(x) = 1 / (1 + exp(-x)) from ex2.approx and rcp.approx (inf in, 1 or 0 out; NaN: NaN)
__device__ __forceinline__ float fast_sigmoid(float x) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return r;
}

// -- the math of each op (forward: f(x); backward: g * f'(x)) --------------------------------
struct Relu {
    // NaN stays NaN, as torch.relu (clamp_min propagates NaN)
    template <class A> static __device__ __forceinline__ A fwd(A x) { return (x > A(0) || m_isnan(x)) ? x : A(0); }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        return x > A(0) ? g : A(0);  // torch: threshold_backward(grad, relu(x), 0); NaN x gives 0
    }
    static __device__ __forceinline__ float fwd_fast(float x) { return fwd(x); }
    static __device__ __forceinline__ float bwd_fast(float g, float x) { return bwd(g, x); }
};

struct GeluErf {  // 0.5 x (1 + erf(x / sqrt 2))
    template <class A> static __device__ __forceinline__ A fwd(A x) {
        return A(0.5) * x * (A(1) + m_erf(x * A(0.70710678118654752440)));
    }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        const A cdf = A(0.5) * (A(1) + m_erf(x * A(0.70710678118654752440)));
        const A pdf = m_exp(A(-0.5) * x * x) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
        return g * (cdf + x * pdf);
    }
    static __device__ __forceinline__ float fwd_fast(float x) { return fwd(x); }  // erf: no cheap form
    static __device__ __forceinline__ float bwd_fast(float g, float x) { return bwd(g, x); }
};

struct GeluTanh {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's approximate="tanh"
    template <class A> static __device__ __forceinline__ A fwd(A x) {
        const A inner = A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
        return A(0.5) * x * (A(1) + m_tanh(inner));
    }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        const A x2 = x * x;
        const A t = m_tanh(A(0.79788456080286535588) * (x + A(0.044715) * x2 * x));
        const A left = A(0.5) * x, right = A(1) + t;
        const A dright = left * (A(1) - t * t) * A(0.79788456080286535588) * (A(1) + A(3 * 0.044715) * x2);
        return g * (A(0.5) * right + dright);
    }
    // 0.5 (1 + tanh(u)) = sigmoid(2u), 1 - tanh(u)^2 = 4 s (1 - s): exact identities
    static __device__ __forceinline__ float fwd_fast(float x) {
        return x * fast_sigmoid(1.5957691216057307f * (x + 0.044715f * x * x * x));
    }
    static __device__ __forceinline__ float bwd_fast(float g, float x) {
        const float x2 = x * x;
        const float s = fast_sigmoid(1.5957691216057307f * (x + 0.044715f * x2 * x));
        return g * (s + 2.0f * x * s * (1.0f - s) * 0.79788456080286535588f * (1.0f + float(3 * 0.044715) * x2));
    }
};

struct Silu {  // x * sigmoid(x)
    template <class A> static __device__ __forceinline__ A fwd(A x) { return x / (A(1) + m_exp(-x)); }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        const A s = A(1) / (A(1) + m_exp(-x));
        return g * s * (A(1) + x * (A(1) - s));
    }
    static __device__ __forceinline__ float fwd_fast(float x) { return x * fast_sigmoid(x); }
    static __device__ __forceinline__ float bwd_fast(float g, float x) {
        const float s = fast_sigmoid(x);
        return g * s * (1.0f + x * (1.0f - s));
    }
};

// Op's forward and backward for elements of T: the fast forms for the 16-bit types
template <class Op, class T, class A> __device__ __forceinline__ A act_fwd(A x) {
    if constexpr (sizeof(T) == 2) return Op::fwd_fast(x);
    else return Op::fwd(x);
}
template <class Op, class T, class A> __device__ __forceinline__ A act_bwd(A g, A x) {
    if constexpr (sizeof(T) == 2) return Op::bwd_fast(g, x);
    else return Op::bwd(g, x);
}

}  // namespace opsmith
