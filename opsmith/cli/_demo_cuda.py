"""The demo's CUDA part: opsmith.ops's ReLU kernel (``opsmith/ops/kernels/elementwise.cu``,
``relu_fwd<float>``) through the NVRTC kernel path, launched with the ops' launch plan."""
from __future__ import annotations

__all__ = ["relu_module"]


def relu_module():
    """A function ``relu(x) -> y`` for contiguous float32 CUDA tensors."""
    import torch

    from opsmith._torch._cuda_module import CudaModule
    from opsmith.ops import _launch, _sources
    kernel = CudaModule(_sources.KERNEL_DIR / "elementwise.cu", name_expressions=["relu_fwd<float>"],
                        name="opsmith/ops/kernels/elementwise.cu").get_kernel("relu_fwd<float>")

    def relu(x):
        y = torch.empty_like(x)
        n = x.numel()
        if n:
            plan = _launch.elementwise_plan(n, 4, _launch.device_props(x.get_device()))
            kernel.launch(_launch.launch_config(plan), x, y, n)
        return y
    return relu
