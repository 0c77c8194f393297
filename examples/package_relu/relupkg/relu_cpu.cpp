// relupkg's CPU implementations for ONNX Runtime's CPU provider (opsmith package --with onnxruntime):
// the arguments of the op's kernel, then ORT's thread pool (docs/onnx.md, the CPU-function contract).
template <typename T> static void relu_cpu(const T *x, T *y, long long n, const opsmith::cpu_context &cpu) {
    cpu.parallel_for(n, 1 << 14, [=](long long b, long long e) {
        for (long long i = b; i < e; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
    });
}

template <typename T>
static void relu_bwd_cpu(const T *grad, const T *x, T *dx, long long n, const opsmith::cpu_context &cpu) {
    cpu.parallel_for(n, 1 << 14, [=](long long b, long long e) {
        for (long long i = b; i < e; ++i) dx[i] = x[i] > T(0) ? grad[i] : T(0);
    });
}
