// The activations of opsmith.ops: forward f(x) and backward g * f'(x), in the accumulation type
// A (float, or double for double). Shared by elementwise.cu (relu, gelu, silu) and gated.cu
// (silu_and_mul, gelu_and_mul).
#pragma once
#include "common.cuh"

namespace opsmith {

// -- the math of each op (forward: f(x); backward: g * f'(x)) --------------------------------
struct Relu {
    // NaN stays NaN, as torch.relu (clamp_min propagates NaN)
    template <class A> static __device__ __forceinline__ A fwd(A x) { return (x > A(0) || m_isnan(x)) ? x : A(0); }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        return x > A(0) ? g : A(0);  // torch: threshold_backward(grad, relu(x), 0); NaN x gives 0
    }
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
};

struct Silu {  // x * sigmoid(x)
    template <class A> static __device__ __forceinline__ A fwd(A x) { return x / (A(1) + m_exp(-x)); }
    template <class A> static __device__ __forceinline__ A bwd(A g, A x) {
        const A s = A(1) / (A(1) + m_exp(-x));
        return g * s * (A(1) + x * (A(1) - s));
    }
};

}  // namespace opsmith
