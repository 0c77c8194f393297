// Shared by the forward and backward kernels (a header: the package keys its binaries by the
// bytes of every header a source includes).
#pragma once
__device__ __forceinline__ float relu_of(float v) { return v > 0.f ? v : 0.f; }
