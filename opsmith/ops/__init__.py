"""opsmith.ops: ReLU, GELU, SiLU, Softmax, LayerNorm, RMSNorm and the gated SiLU/GELU (SwiGLU,
GeGLU) as CUDA kernels for torch.

The kernels are readable CUDA sources in ``opsmith/ops/kernels/`` (copy and change them),
compiled through opsmith's NVRTC path on first use (all programs of a dtype at once),
cached, and launched with a configuration chosen from the shape and the device. Every op has
a forward and a backward for float32, float16 and bfloat16 (math in float32) and float64.
``docs/ops.md`` describes the strategies, the tolerances and the benchmark.

``import opsmith.ops`` is cheap: torch is imported on first use of a name.

Examples
--------
>>> import torch, opsmith.ops as ops                            # doctest: +SKIP
>>> x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
>>> y = ops.layer_norm(ops.gelu(x), (1024,))                    # doctest: +SKIP
>>> y.sum().backward()                                          # doctest: +SKIP
"""
from __future__ import annotations

import importlib

_LAZY = {
    "relu": "opsmith.ops._public", "gelu": "opsmith.ops._public",
    "silu": "opsmith.ops._public", "softmax": "opsmith.ops._public",
    "layer_norm": "opsmith.ops._public", "rms_norm": "opsmith.ops._public",
    "silu_and_mul": "opsmith.ops._public", "gelu_and_mul": "opsmith.ops._public",
    "silu_mul": "opsmith.ops._public", "gelu_mul": "opsmith.ops._public",
    "add_rms_norm": "opsmith.ops._public", "add_layer_norm": "opsmith.ops._public",
    "rotary_embedding": "opsmith.ops._public",
    "rotary_embedding_qk": "opsmith.ops._public",
    "cross_entropy": "opsmith.ops._public", "CrossEntropyLoss": "opsmith.ops._modules",
    "SiLUAndMul": "opsmith.ops._modules", "GELUAndMul": "opsmith.ops._modules",
    "ReLU": "opsmith.ops._modules", "GELU": "opsmith.ops._modules", "SiLU": "opsmith.ops._modules",
    "Softmax": "opsmith.ops._modules", "LayerNorm": "opsmith.ops._modules",
    "RMSNorm": "opsmith.ops._modules",
    "benchmark": "opsmith.ops._bench", "copy_bandwidth": "opsmith.ops._bench",
    "BenchResult": "opsmith.ops._bench",
    "warm": "opsmith.ops._sources", "KERNEL_DIR": "opsmith.ops._sources",
    "patch": "opsmith.ops._patch", "Replaced": "opsmith.ops._patch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'opsmith.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
