#include <torch/extension.h>

void relu_cuda_launcher(const float* x, float* y, int n);

// PyTorch 前端包装
torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::zeros_like(x);

    int n = x.numel();

    relu_cuda_launcher(
        x.data_ptr<float>(),
        y.data_ptr<float>(),
        n
    );

    return y;
}

// 绑定到 Python
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("relu", &relu_forward, "ReLU CUDA kernel");
}
