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

// 1 / (1 + 2^z) from ex2.approx and rcp.approx (z = -inf: 1; +inf: 0; NaN: NaN)
__device__ __forceinline__ float sigmoid_exp2(float z) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return r;
}

// sigmoid(x) = 1 / (1 + exp(-x)) (inf in, 1 or 0 out; NaN: NaN)
__device__ __forceinline__ float fast_sigmoid(float x) { return sigmoid_exp2(x * -1.4426950408889634f); }

// -- the math of each op (forward: f(x); backward: g * f'(x)) --------------------------------
// cheap (the gated ops'): the 16-bit forms (fwd_fast, bwd_fast, grad_fast) are cheaper than the exact ones
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
    static constexpr bool cheap = false;
    template <class A> static __device__ __forceinline__ A fwd(A x) {
        return A(0.5) * x * (A(1) + m_erf(x * A(0.70710678118654752440)));
    }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        const A cdf = A(0.5) * (A(1) + m_erf(x * A(0.70710678118654752440)));
        const A pdf = m_exp(A(-0.5) * x * x) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
        return g * (cdf + x * pdf);
    }
    static __device__ __forceinline__ float fwd_fast(float x) { return fwd(x); }  // erf: no cheap form
    static __device__ __forceinline__ float bwd_fast(float g, float x) {
        float y;
        return g * grad_fast(x, y);
    }
    // fwd's and bwd's terms written once here with one erf: as y = fwd(x), bwd(1, x) ptxas computed the
    // erf twice (51 MUFU against 34 in gelu_and_mul_bwd<bf16>, sm_90). The pdf's exp from ex2.approx
    // (subnormals flushed: below 1e-38 the term is far under a 16-bit result's rounding): the exact
    // expf left the bf16 elementwise backward 4-9 % behind torch's (bench/diag_ew_map.py, H200).
    static __device__ __forceinline__ float grad_fast(float x, float& y) {
        const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
        y = x * cdf;
        float e;
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * x * (-0.5f * 1.4426950408889634f)));
        return fmaf(x, e * 0.39894228040143267794f, cdf);
    }
};

struct GeluTanh {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's approximate="tanh"
    static constexpr bool cheap = true;
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
    // 0.5 (1 + tanh(u)) = sigmoid(2u), 1 - tanh(u)^2 = 4 s (1 - s): exact identities. The sigmoid's
    // argument -2u log2(e) = x (K1 + K3 x^2): one fma and one multiply (its constants folded).
    static constexpr float K1 = -1.5957691216057307f * 1.4426950408889634f, K3 = K1 * 0.044715f;
    static __device__ __forceinline__ float sig2u(float x, float x2) { return sigmoid_exp2(x * fmaf(K3, x2, K1)); }
    static __device__ __forceinline__ float fwd_fast(float x) { return x * sig2u(x, x * x); }
    static __device__ __forceinline__ float bwd_fast(float g, float x) {
        float y;
        return g * grad_fast(x, y);
    }
    // f'(x), and f(x) in y, from one sigmoid (the gated backward needs both):
    // f' = s + x s (1 - s) d(2u)/dx, d(2u)/dx = sqrt(8/pi) (1 + 3 * 0.044715 x^2)
    static __device__ __forceinline__ float grad_fast(float x, float& y) {
        const float x2 = x * x;
        const float s = sig2u(x, x2);
        y = x * s;
        const float t = x * fmaf(1.5957691216057307f * 3 * 0.044715f, x2, 1.5957691216057307f);
        return fmaf(t, fmaf(-s, s, s), s);
    }
};

struct Silu {  // x * sigmoid(x)
    static constexpr bool cheap = true;
    template <class A> static __device__ __forceinline__ A fwd(A x) { return x / (A(1) + m_exp(-x)); }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        const A s = A(1) / (A(1) + m_exp(-x));
        return g * s * (A(1) + x * (A(1) - s));
    }
    static __device__ __forceinline__ float fwd_fast(float x) { return x * fast_sigmoid(x); }
    static __device__ __forceinline__ float bwd_fast(float g, float x) {
        float y;
        return g * grad_fast(x, y);
    }
    static __device__ __forceinline__ float grad_fast(float x, float& y) {
        const float s = fast_sigmoid(x);
        y = x * s;
        return fmaf(y, 1.0f - s, s);  // s (1 + x (1 - s))
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
