#include <cuda_runtime.h>

__global__ void relu_kernel(const float* __restrict__ x,
                            float* __restrict__ y,
                            int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        float val = x[idx];
        y[idx] = val > 0 ? val : 0.f;
    }
}

void relu_cuda_launcher(const float* x, float* y, int n) {
    int threads = 256;                     // 每个 block 256 个 thread
    int blocks = (n + threads - 1) / threads;

    relu_kernel<<<blocks, threads>>>(x, y, n);
}
