// The tutorial's ReLU as a package: forward and backward kernels, one float per thread.
#include "relu_common.cuh"

extern "C" __global__ void relu_fwd(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = relu_of(x[i]);
}

extern "C" __global__ void relu_bwd(const float* grad, const float* x, float* dx, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = x[i] > 0.f ? grad[i] : 0.f;
}
