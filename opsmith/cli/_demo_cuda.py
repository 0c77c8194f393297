"""The demo's CUDA part: the vectorised ReLU through the NVRTC kernel path."""
from __future__ import annotations

__all__ = ["RELU_CU", "relu_module"]

# The shipped example (examples/relu_kernel.cu): one float4 per thread, scalar tail.
RELU_CU = r'''
extern "C" __global__ void relu_f32x4(const float* __restrict__ x, float* __restrict__ y,
                                      long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool aligned = ((reinterpret_cast<unsigned long long>(x) |
                     reinterpret_cast<unsigned long long>(y)) & 15) == 0;
    if (aligned) {
        long long n4 = n >> 2;
        if (i < n4) {
            float4 v = __ldcs(reinterpret_cast<const float4*>(x) + i);
            v.x = v.x > 0.f ? v.x : 0.f;
            v.y = v.y > 0.f ? v.y : 0.f;
            v.z = v.z > 0.f ? v.z : 0.f;
            v.w = v.w > 0.f ? v.w : 0.f;
            __stcs(reinterpret_cast<float4*>(y) + i, v);
        }
        long long t = (n4 << 2) + i;
        if (i < (n & 3)) {
            float v = x[t];
            y[t] = v > 0.f ? v : 0.f;
        }
    } else {
        for (long long j = i * 4; j < n && j < i * 4 + 4; ++j) {
            float v = x[j];
            y[j] = v > 0.f ? v : 0.f;
        }
    }
}
'''


def relu_module():
    """A function ``relu(x) -> y`` for contiguous float32 CUDA tensors."""
    import torch

    from opsmith._torch._cuda_module import cuda_kernel
    kernel = cuda_kernel(RELU_CU, "relu_f32x4")

    def relu(x):
        y = torch.empty_like(x)
        n = x.numel()
        kernel.launch_n((n + 3) // 4, x, y, n)
        return y
    return relu
