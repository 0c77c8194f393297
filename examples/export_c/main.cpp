// Plain C++ that runs kernels exported by `opsmith export-c`: no torch, no Python, no cuda.h and no
// libcuda at link time. Build (see build.sh):
//   opsmith export-c kernels.cu -k relu -k 'axpy_f=axpy<float>' -k empty --prefix ex -o out
//   gcc -std=c99 -O2 -c out/ex.c -o out/ex.o
//   g++ -std=c++17 -O2 -Wall -Wextra -Iout main.cpp out/ex.o -ldl -lpthread -o example
// Usage: ./example [device]   Prints one line per check and exits 1 if a result is wrong.
#include "ex.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef unsigned long long devptr;  // cuda.h's CUdeviceptr
// The few driver calls the example needs for memory, taken through the generated get_proc.
static opsmith_CUresult (*memAlloc)(devptr*, size_t);
static opsmith_CUresult (*memFree)(devptr);
static opsmith_CUresult (*htod)(devptr, const void*, size_t);
static opsmith_CUresult (*dtoh)(void*, devptr, size_t);
static opsmith_CUresult (*ctxSynchronize)();
static opsmith_CUresult (*primaryCtxRetain)(void**, int);
static opsmith_CUresult (*ctxSetCurrent)(void*);

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        opsmith_CUresult r_ = (call);                                                               \
        if (r_ != 0) {                                                                              \
            std::fprintf(stderr, "%s failed: %s\n  %s\n", #call, opsmith_ex_error_string(r_),        \
                         opsmith_ex_last_error());                                                  \
            return 2;                                                                               \
        }                                                                                           \
    } while (0)

template <typename F>
static opsmith_CUresult proc(const char* name, F* fn) {
    void* p = nullptr;
    opsmith_CUresult r = opsmith_ex_get_proc(name, &p);
    std::memcpy(fn, &p, sizeof p);
    return r;
}

int main(int argc, char** argv) {
    int device = argc > 1 ? std::atoi(argv[1]) : 0;
    CHECK(opsmith_ex_load(device));  // once per device; launches would also load on first use
    CHECK(proc("cuMemAlloc", &memAlloc));
    CHECK(proc("cuMemFree", &memFree));
    CHECK(proc("cuMemcpyHtoD", &htod));
    CHECK(proc("cuMemcpyDtoH", &dtoh));
    CHECK(proc("cuCtxSynchronize", &ctxSynchronize));
    CHECK(proc("cuDevicePrimaryCtxRetain", &primaryCtxRetain));
    CHECK(proc("cuCtxSetCurrent", &ctxSetCurrent));
    void* ctx = nullptr;  // launches run on the current context's device: make `device` current
    CHECK(primaryCtxRetain(&ctx, device));
    CHECK(ctxSetCurrent(ctx));
    std::printf("device %d: loaded %s\n", device, opsmith_ex_loaded_arch(device));

    const int n = 1 << 20;
    std::vector<float> x(n), y(n), out(n);
    for (int i = 0; i < n; ++i) {
        x[i] = std::sin(0.001f * i) * 3.f;
        y[i] = 0.5f * (i % 7);
    }
    devptr dx, dy;
    CHECK(memAlloc(&dx, n * sizeof(float)));
    CHECK(memAlloc(&dy, n * sizeof(float)));
    CHECK(htod(dx, x.data(), n * sizeof(float)));
    const opsmith_dim3 block = opsmith_dim3_make(256, 1, 1);
    const opsmith_dim3 grid = opsmith_dim3_make((n + 255) / 256, 1, 1);
    int bad = 0;

    // relu: y = max(x, 0)
    CHECK(opsmith_ex_relu_launch(nullptr, grid, block, 0, (const float*)dx, (float*)dy, (long long)n));
    CHECK(ctxSynchronize());
    CHECK(dtoh(out.data(), dy, n * sizeof(float)));
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += out[i] != (x[i] > 0.f ? x[i] : 0.f);
    std::printf("relu: %s (%d of %d wrong)\n", wrong ? "WRONG" : "ok", wrong, n);
    bad += wrong != 0;

    // axpy<float>: y = a * x + y
    CHECK(htod(dy, y.data(), n * sizeof(float)));
    CHECK(opsmith_ex_axpy_f_launch(nullptr, grid, block, 0, 2.5f, (const float*)dx, (float*)dy, n));
    CHECK(ctxSynchronize());
    CHECK(dtoh(out.data(), dy, n * sizeof(float)));
    wrong = 0;
    for (int i = 0; i < n; ++i) wrong += std::fabs(out[i] - (2.5f * x[i] + y[i])) > 1e-5f;
    std::printf("axpy<float>: %s (%d of %d wrong)\n", wrong ? "WRONG" : "ok", wrong, n);
    bad += wrong != 0;

    // static resources, and an error that comes back as a value
    opsmith_kernel_attributes at;
    CHECK(opsmith_ex_axpy_f_attributes(device, &at));
    std::printf("axpy<float> attributes: registers %d, static shared %d, max dynamic shared %d, binary %d\n",
                at.num_regs, at.shared_size_bytes, at.max_dynamic_shared_size_bytes, at.binary_version);
    opsmith_CUresult r = opsmith_ex_relu_launch(nullptr, grid, opsmith_dim3_make(4096, 1, 1), 0,
                                                (const float*)dx, (float*)dy, (long long)n);
    std::printf("a block of 4096 threads is refused: %s (%s)\n", r != 0 ? "ok" : "WRONG", opsmith_ex_last_error());
    bad += r == 0;

    CHECK(memFree(dx));
    CHECK(memFree(dy));
    CHECK(opsmith_ex_unload());
    std::printf("%s\n", bad ? "FAILED" : "all checks passed");
    return bad ? 1 : 0;
}
