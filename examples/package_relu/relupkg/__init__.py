"""The tutorial's ReLU as an installable package of ops: ``opsmith package relupkg`` makes its
wheel; ``import relupkg`` then registers ``torch.ops.relupkg.relu`` (with autograd) and
compiles nothing where the wheel has the kernels (docs/packaging.md)."""
from pathlib import Path

import opsmith

__version__ = "1.0.0"

# ONNX Runtime's CPU provider runs these (opsmith package --with onnxruntime); the CUDA provider the kernels
__opsmith_onnx__ = {"cpu_source": "relu_cpu.cpp",
                    "cpu": {"relupkg::relu": "relu_cpu", "relupkg::relu_backward": "relu_bwd_cpu"}}

_mod = opsmith.CudaModule(Path(__file__).with_name("relu_kernel.cu"))

relu_backward = opsmith.custom_op("relupkg::relu_backward", kernel=_mod.get_kernel("relu_bwd"),
                                  cpu=lambda grad, x: grad * (x > 0))
relu = opsmith.custom_op("relupkg::relu", kernel=_mod.get_kernel("relu_fwd"), cpu=lambda x: x.clamp_min(0))
relu.register_autograd(relu_backward, args=("grad0", "x"), grads_for=("x",))
