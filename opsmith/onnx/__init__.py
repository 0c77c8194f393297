"""opsmith ops in ONNX and ONNX Runtime.

Build an ORT custom-op library from ``opsmith.custom_op`` ops (the CUDA provider launches the
same NVRTC kernels on ORT's compute stream; the CPU provider calls a C++ function you give),
export a model whose nodes are those ops, and run it::

    lib = opsmith.onnx.build_library([relu], cpu_source=opsmith.onnx.RELU_CPU_SOURCE,
                                     cpu={"mylib::relu": "relu_cpu"})
    opsmith.onnx.export(model, (x,), "model.onnx")            # torch.onnx.export, dynamo=True
    sess = opsmith.onnx.inference_session("model.onnx", lib, providers=["CPUExecutionProvider"])

See docs/onnx.md.
"""
from opsmith._build._ort_lib import OrtLibrary
from opsmith._build._ort_lib import load_manifest as load_library
from opsmith._onnx._session import inference_session, session_options
from opsmith._torch._onnx import (RELU_CPU_SOURCE, build_library, export, register_symbolics,
                                  translation_table)

__all__ = ["OrtLibrary", "RELU_CPU_SOURCE", "build_library", "export", "inference_session", "load_library",
           "register_symbolics", "session_options", "translation_table"]
